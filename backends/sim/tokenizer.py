"""A deterministic stand-in for a BPE tokenizer: real-looking token counts without a vocabulary file.

Text is pre-split the way BPE pre-tokenizers split it (words with their leading space, digit
groups, punctuation runs, whitespace runs); long pieces are cut into ~4-character chunks, which
gives about 4 characters per token on English. A piece's id is a hash of its text, so equal text
always gives equal ids, which is what prefix caching needs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import xxhash

VOCAB_SIZE = 128256
NUM_TEXT_TOKENS = 128000

BEGIN_OF_TEXT = 128000
END_OF_TEXT = 128001
START_HEADER = 128006
END_HEADER = 128007
END_OF_MESSAGE = 128008
END_OF_TURN = 128009
PYTHON_TAG = 128010

SPECIAL_TOKENS = {
    BEGIN_OF_TEXT: "<|begin_of_text|>",
    END_OF_TEXT: "<|end_of_text|>",
    START_HEADER: "<|start_header_id|>",
    END_HEADER: "<|end_header_id|>",
    END_OF_MESSAGE: "<|eom_id|>",
    END_OF_TURN: "<|eot_id|>",
    PYTHON_TAG: "<|python_tag|>",
}

_PIECE = re.compile(r" ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\s*\n|\s+(?!\S)|\s+|_+")
_MAX_PIECE_CHARS = 6
_CHUNK_CHARS = 4
_PIECE_CACHE_SIZE = 1 << 16

# Short words (at most five letters) so a word with its leading space is a single piece:
# generated text re-encodes to the same ids, and a conversation's next turn hits the cache.
_WORD_LIST = (
    "the of and to in is it that for on was with as be at by this had not are but from or have an they "
    "which one you were all we when there can their been has more if will would so what up out about "
    "who into them then some could time these two may first only new very my also any like our over "
    "such me even most made after where many well way down just those too here must both each much "
    "every under never light model cache token route fast small large data query reply state value "
    "layer batch graph node tree queue shard spill serve load input text word line page block tile"
)
OUTPUT_WORDS: tuple[str, ...] = tuple(_WORD_LIST.split())


def check_token_ids(ids: list[int]) -> None:
    """Reject ids outside the vocabulary (a ValueError, which the routes turn into a 400)."""
    if ids and (min(ids) < 0 or max(ids) >= VOCAB_SIZE):
        bad = next(token for token in ids if not 0 <= token < VOCAB_SIZE)
        raise ValueError(f"Token id {bad} is out of the vocabulary range [0, {VOCAB_SIZE}).")


def _piece_id(piece: str) -> int:
    return xxhash.xxh3_64_intdigest(piece.encode()) % NUM_TEXT_TOKENS


class Tokenizer:
    """Text <-> token ids. Decoding knows the output vocabulary; other ids render as placeholders."""

    def __init__(self) -> None:
        self._words: dict[int, str] = {}
        for piece in (".", ","):
            self._words[_piece_id(piece)] = piece
        kept = []
        for word in OUTPUT_WORDS:
            variants = (word, " " + word, word.capitalize(), " " + word.capitalize())
            ids = {_piece_id(piece): piece for piece in variants}
            if len(ids) == len(variants) and not ids.keys() & self._words.keys():
                self._words.update(ids)
                kept.append(word)
        # Words whose ids collide with another piece are dropped, so decoding is unambiguous.
        self.output_words: tuple[str, ...] = tuple(kept)
        # Text repeats (system prompts, conversation history), so piece ids are memoised.
        self._piece_cache: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        cache = self._piece_cache
        for piece in _PIECE.findall(text):
            piece_ids = cache.get(piece)
            if piece_ids is None:
                piece_ids = self._encode_piece(piece)
                if len(cache) >= _PIECE_CACHE_SIZE:
                    cache.clear()
                cache[piece] = piece_ids
            ids.extend(piece_ids)
        return ids

    def encode_pieces(self, text: str) -> list[tuple[int, str]]:
        """``text`` as (id, text) tokens: what :meth:`encode` gives, each id with the characters it stands for, so
        a reply fixed in advance (constrained JSON) decodes back to exactly ``text``."""
        tokens: list[tuple[int, str]] = []
        for piece in _PIECE.findall(text):
            if len(piece) <= _MAX_PIECE_CHARS:
                tokens.append((_piece_id(piece), piece))
            else:
                chunks = (piece[i : i + _CHUNK_CHARS] for i in range(0, len(piece), _CHUNK_CHARS))
                tokens.extend((_piece_id(chunk), chunk) for chunk in chunks)
        return tokens

    @staticmethod
    def _encode_piece(piece: str) -> tuple[int, ...]:
        if len(piece) <= _MAX_PIECE_CHARS:
            return (_piece_id(piece),)
        return tuple(_piece_id(piece[i : i + _CHUNK_CHARS]) for i in range(0, len(piece), _CHUNK_CHARS))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        parts = []
        for token_id in ids:
            if token_id in SPECIAL_TOKENS:
                if not skip_special_tokens:
                    parts.append(SPECIAL_TOKENS[token_id])
            else:
                parts.append(self._words.get(token_id) or f" <{token_id}>")
        return "".join(parts)

    def piece_id(self, piece: str) -> int:
        """The id of one piece of text that encodes to a single token (an output word)."""
        return _piece_id(piece)

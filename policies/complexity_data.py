"""Routing evidence as JSON lines: an ask and either a label or both models' results on it.

One object a line:

- the ask: ``prompt`` (a string) or ``messages`` (an OpenAI chat list), optionally ``tools``;
- the evidence: ``label`` (true, 1 or "complex" when the ask needs the frontier model), or ``weak`` and ``strong``
  (each model's result: 1/0 correctness or a score; aliases ``weak_score`` and ``strong_score``);
- optionally ``id`` (default: a hash of the ask), ``set`` (a name to report figures by) and ``weight`` (how much
  the line counts in training, default 1).

With both results the label is "the strong model did better"; with a label only, routing quality counts a labelled
ask as one the weak model fails and the strong one passes, and any other as one both pass.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from spillgate.policies.complexity_curve import Outcome

TRAIN_PERCENT = 60


class EvidenceError(ValueError):
    """A line of an evidence file that cannot be used, with its line number."""


class Record(NamedTuple):
    id: str
    set: str
    payload: dict[str, Any]
    outcome: Outcome
    weight: float = 1.0

    @property
    def label(self) -> bool:
        return self.outcome.strong > self.outcome.weak


def split_of(item_id: str, train_percent: int = TRAIN_PERCENT) -> str:
    """``train`` or ``test``, fixed by a hash of the id: adding items moves none, and no ask is in both."""
    return "train" if int(hashlib.sha256(item_id.encode()).hexdigest()[:8], 16) % 100 < train_percent else "test"


def read_evidence(path: str | Path) -> list[Record]:
    """Every record of a ``.jsonl`` (or ``.jsonl.gz``) evidence file; a bad line raises ``EvidenceError``."""
    return list(_records(Path(path)))


def _records(path: Path) -> Iterator[Record]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield parse_record(line, number)


def parse_record(line: str, number: int = 0) -> Record:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as error:
        raise EvidenceError(f"line {number}: not JSON ({error.msg})") from None
    if not isinstance(item, dict):
        raise EvidenceError(f"line {number}: expected an object")
    payload = _payload(item, number)
    ask = json.dumps(payload, sort_keys=True)
    item_id = str(item.get("id") or hashlib.sha256(ask.encode()).hexdigest()[:12])
    weight = item.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < 1e6:
        raise EvidenceError(f"line {number}: 'weight' must be a positive number")
    return Record(item_id, str(item.get("set", "data")), payload, _outcome(item, number), float(weight))


def _payload(item: dict[str, Any], number: int) -> dict[str, Any]:
    if isinstance(item.get("prompt"), str):
        payload: dict[str, Any] = {"messages": [{"role": "user", "content": item["prompt"]}]}
    elif isinstance(item.get("messages"), list) and item["messages"]:
        payload = {"messages": item["messages"]}
    else:
        raise EvidenceError(f"line {number}: needs 'prompt' (a string) or 'messages' (a list)")
    if isinstance(item.get("tools"), list):
        payload["tools"] = item["tools"]
    return payload


def _outcome(item: dict[str, Any], number: int) -> Outcome:
    weak = item.get("weak", item.get("weak_score"))
    strong = item.get("strong", item.get("strong_score"))
    if weak is not None or strong is not None:
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (weak, strong)):
            raise EvidenceError(f"line {number}: 'weak' and 'strong' must both be numbers")
        return Outcome(float(weak), float(strong))
    label = item.get("label")
    if label in (True, 1, "complex", "1", "true"):
        return Outcome(0.0, 1.0)
    if label in (False, 0, "simple", "0", "false"):
        return Outcome(1.0, 1.0)
    raise EvidenceError(f"line {number}: needs 'label' (true/false, 1/0, complex/simple) or 'weak' and 'strong'")

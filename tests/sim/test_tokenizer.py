"""The deterministic tokenizer, chat template and output generator."""

from __future__ import annotations

from spillgate.backends.sim.chat_template import ChatTemplate
from spillgate.backends.sim.generation import TokenStream, plan_output, request_seed
from spillgate.backends.sim.tokenizer import END_OF_TURN, Tokenizer

ENGLISH = (
    "Prefix caching lets a serving engine reuse the attention keys and values it computed for a shared "
    "prompt prefix. That cuts the time to first token for multi-turn chats and agents with long system "
    "prompts, which is why routing requests to the replica that already holds their prefix matters."
)


def test_about_four_characters_per_token() -> None:
    ids = Tokenizer().encode(ENGLISH)
    assert 3.0 < len(ENGLISH) / len(ids) < 5.0


def test_encoding_is_deterministic() -> None:
    assert Tokenizer().encode(ENGLISH) == Tokenizer().encode(ENGLISH)
    assert Tokenizer().encode("hello world") != Tokenizer().encode("hello there")


def test_generated_text_reencodes_to_the_same_ids() -> None:
    tokenizer = Tokenizer()
    plan = plan_output(7, 200, exact=True)
    stream = TokenStream(tokenizer, 7, plan)
    ids = [stream.next_id() for _ in range(plan.length)]
    assert tokenizer.encode(tokenizer.decode(ids)) == ids


def test_conversation_turns_share_their_prefix() -> None:
    template = ChatTemplate(Tokenizer())
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a radix tree?"}]
    prompt1 = template.render(turn1, tools)
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "A compressed trie."},
        {"role": "user", "content": [{"type": "text", "text": "And eviction?"}]},
    ]
    prompt2 = template.render(turn2, tools)
    assert prompt2[: len(prompt1)] == prompt1
    assert len(prompt2) > len(prompt1)
    assert template.render(turn1) != prompt1  # tool definitions are part of the prompt


def test_output_plans() -> None:
    assert plan_output(1, 50, exact=True).length == 50
    assert plan_output(1, 50, exact=True).finish_reason() == {"type": "length", "length": 50}
    natural = plan_output(1, None, exact=False)
    assert natural.stops and 16 <= natural.length <= 400
    assert natural.finish_reason() == {"type": "stop", "matched": END_OF_TURN}
    assert plan_output(1, 3, exact=False).length == 3


def test_request_seed_depends_on_prompt_and_client_seed() -> None:
    assert request_seed([1, 2, 3], 0, None) == request_seed([1, 2, 3], 0, None)
    assert request_seed([1, 2, 3], 0, None) != request_seed([1, 2, 4], 0, None)
    assert request_seed([1, 2, 3], 0, 5) != request_seed([1, 2, 3], 0, 6)

"""The requests a run sends: gsp, chat, agent and trace workloads behind one small interface.

Independent requests (gsp, trace) come from lazy generators so a long run never holds every prompt.
Conversations (chat, agent) depend on earlier replies: a session's next turn exists only once its previous
turn has answered, so ``next()`` may wait for a ready session, and ``finished()`` feeds the reply back.
Every text is derived from ``salt`` (seed and level), so a run is reproducible and sweep levels do not warm
each other's prefix caches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Protocol

from spillgate.gateway.bench import text
from spillgate.gateway.bench.config import SESSION_ORDERS, AgentKnobs, BenchConfig, ChatKnobs, GspKnobs
from spillgate.gateway.bench.trace import BLOCK_TOKENS, PromptBuilder, TraceRecord

Message = dict[str, str]
_JSON_CHARS_PER_TOKEN = 3.3  # JSON's quotes and punctuation make its tokens shorter than prose's ~4 characters


@dataclass
class Conversation:
    """One chat or agent session: the messages so far and how many turns have been answered."""

    id: int
    messages: list[Message]
    turns: int = 0


@dataclass(slots=True)
class RequestSpec:
    """One chat completion to send; ``session`` is set when the reply must be fed back."""

    messages: list[Message]
    max_tokens: int
    session: Conversation | None = field(default=None, repr=False)


class Workload(Protocol):
    natural_size: int
    """Requests in one pass over the workload (gsp: groups x prompts; chat: sessions x turns; trace: records)."""

    async def next(self) -> RequestSpec | None:
        """The next request, waiting for a ready session if need be; ``None`` once the workload is spent."""
        ...

    def finished(self, spec: RequestSpec, reply: str | None) -> None:
        """``spec`` is done: ``reply`` is the assistant's text, or ``None`` when it failed or was cut short."""
        ...


class IndependentWorkload:
    """Requests that depend on nothing: taken from an iterator in order."""

    def __init__(self, requests: Iterator[RequestSpec], natural_size: int) -> None:
        self._requests = requests
        self.natural_size = natural_size

    async def next(self) -> RequestSpec | None:
        return next(self._requests, None)

    def finished(self, spec: RequestSpec, reply: str | None) -> None:
        return None


class ReadySessions:
    """Sessions waiting to send their next turn; ``get`` takes one at random, or the longest waiting (``fifo``).

    Random is the default of SGLang's multi-turn benchmark, and the realistic one: in FIFO order, sessions that
    one batch answered together send their next turns one after another, so a router keeping each session on
    its replica sees convoys of turns that no real user population sends.
    """

    def __init__(self, rng: random.Random | None) -> None:
        self._rng = rng
        self._waiting: deque[Conversation] = deque()
        self._changed = asyncio.Event()
        self._closed = False

    def put(self, session: Conversation) -> None:
        self._waiting.append(session)
        self._changed.set()

    def close(self) -> None:
        """No session will ever be ready again: waiting and later ``get`` calls return ``None``."""
        self._closed = True
        self._changed.set()

    async def get(self) -> Conversation | None:
        while not self._waiting:
            if self._closed:
                return None
            self._changed.clear()
            await self._changed.wait()
        if self._rng is None:
            return self._waiting.popleft()
        index = self._rng.randrange(len(self._waiting))
        self._waiting[index], self._waiting[-1] = self._waiting[-1], self._waiting[index]
        return self._waiting.pop()


class SessionWorkload:
    """Interleaved conversations: a turn's reply makes its session ready again, and ``next`` takes a ready one.

    A failed turn ends its session (there is no reply to continue from). With ``cycle`` an ended session is
    replaced by a fresh one, so the number of live sessions stays constant for as long as the run lasts.
    """

    def __init__(
        self,
        *,
        sessions: int,
        turns: int,
        output_tokens: int,
        opening: Callable[[int], list[Message]],
        follow_up: Callable[[int, int], Message],
        cycle: bool,
        ready: ReadySessions,
    ) -> None:
        self.natural_size = sessions * turns
        self._turns = turns
        self._output_tokens = output_tokens
        self._opening = opening
        self._follow_up = follow_up
        self._cycle = cycle
        self._ready = ready
        self._ids = count()
        self._live = 0
        for _ in range(sessions):
            self._open()

    def _open(self) -> None:
        session_id = next(self._ids)
        self._live += 1
        self._ready.put(Conversation(session_id, self._opening(session_id)))

    async def next(self) -> RequestSpec | None:
        session = await self._ready.get()
        if session is None:
            return None
        return RequestSpec(list(session.messages), self._output_tokens, session)

    def finished(self, spec: RequestSpec, reply: str | None) -> None:
        session = spec.session
        if session is None:
            return
        session.turns += 1
        if reply is not None and session.turns < self._turns:
            session.messages.append({"role": "assistant", "content": reply})
            session.messages.append(self._follow_up(session.id, session.turns))
            self._ready.put(session)
            return
        self._live -= 1
        if self._cycle:
            self._open()
        elif self._live == 0:
            self._ready.close()


class ScriptedSessions:
    """Replays a recorded order of turns: request ``i`` is the next turn of session ``script[i]``.

    For a reference run that must send the very turns another run sent, where the order of sessions depended on
    timing. Meant to run one request at a time; a session whose previous turn is still out is waited for.
    """

    def __init__(
        self,
        script: Sequence[int],
        *,
        output_tokens: int,
        opening: Callable[[int], list[Message]],
        follow_up: Callable[[int, int], Message],
    ) -> None:
        self.natural_size = len(script)
        self._script = iter(script)
        self._output_tokens = output_tokens
        self._opening = opening
        self._follow_up = follow_up
        self._sessions: dict[int, Conversation] = {}
        self._out: set[int] = set()
        self._answered = asyncio.Event()

    async def next(self) -> RequestSpec | None:
        session_id = next(self._script, None)
        if session_id is None:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = Conversation(session_id, self._opening(session_id))
        while session_id in self._out:
            self._answered.clear()
            await self._answered.wait()
        self._out.add(session_id)
        return RequestSpec(list(session.messages), self._output_tokens, session)

    def finished(self, spec: RequestSpec, reply: str | None) -> None:
        session = spec.session
        if session is None:
            return
        self._out.discard(session.id)
        self._answered.set()
        session.turns += 1
        session.messages.append({"role": "assistant", "content": reply or ""})
        session.messages.append(self._follow_up(session.id, session.turns))


# Workload builders -------------------------------------------------------------------------------------


def gsp_workload(knobs: GspKnobs, salt: str, cycle: bool) -> IndependentWorkload:
    """Each group's system prompt is shared by its questions; requests interleave groups in a seeded order.

    A second pass (``cycle``) asks new questions behind the same system prompts (under ``zipf``, drawing each
    question's group anew).
    """
    systems = [text.text(text.rng_for(salt, "gsp-system", group), knobs.system_tokens) for group in range(knobs.groups)]
    size = knobs.groups * knobs.prompts_per_group
    weights = knobs.group_weights()

    def groups(epoch: int) -> list[int]:
        if weights is None:
            return [index // knobs.prompts_per_group for index in range(size)]
        return text.rng_for(salt, "gsp-groups", epoch).choices(range(knobs.groups), weights=weights, k=size)

    def requests() -> Iterator[RequestSpec]:
        for epoch in count() if cycle else range(1):
            group_of = groups(epoch)
            order = list(range(size))
            text.rng_for(salt, "gsp-order", epoch).shuffle(order)
            for index in order:
                question = text.text(text.rng_for(salt, "gsp-question", epoch, index), knobs.question_tokens)
                messages = [
                    {"role": "system", "content": systems[group_of[index]]},
                    {"role": "user", "content": question},
                ]
                yield RequestSpec(messages, knobs.output_tokens)

    return IndependentWorkload(requests(), size)


def ready_sessions(order: str, salt: str) -> ReadySessions:
    """The ready queue for ``order`` (``random`` or ``fifo``), its random choices seeded by ``salt``."""
    if order not in SESSION_ORDERS:
        raise ValueError(f"session order must be one of {', '.join(SESSION_ORDERS)}, got {order!r}")
    return ReadySessions(text.rng_for(salt, "ready") if order == "random" else None)


def chat_workload(
    knobs: ChatKnobs, salt: str, cycle: bool, order: str = "random", script: Sequence[int] | None = None
) -> Workload:
    """Conversations that open with a user message; ``script`` replays a recorded order of turns instead."""

    def user(session: int, turn: int) -> Message:
        return {"role": "user", "content": text.text(text.rng_for(salt, "chat", session, turn), knobs.user_tokens)}

    def opening(session: int) -> list[Message]:
        return [user(session, 0)]

    if script is not None:
        return ScriptedSessions(script, output_tokens=knobs.output_tokens, opening=opening, follow_up=user)
    return SessionWorkload(
        sessions=knobs.sessions,
        turns=knobs.turns,
        output_tokens=knobs.output_tokens,
        opening=opening,
        follow_up=user,
        cycle=cycle,
        ready=ready_sessions(order, salt),
    )


def tool_definitions(salt: str, tokens: int) -> str:
    """JSON tool schemas, one per line, of about ``tokens`` tokens, the same for every session."""
    rng = text.rng_for(salt, "agent-tools")
    kinds = ("string", "integer", "number", "boolean")
    tools = []
    size = 0
    while size < tokens * _JSON_CHARS_PER_TOKEN:
        name = "_".join(rng.sample(text.WORDS, 2))
        properties = {
            "_".join(rng.sample(text.WORDS, 2)): {
                "type": rng.choice(kinds),
                "description": text.text(rng, 10).strip(),
            }
            for _ in range(rng.randint(2, 5))
        }
        tool = {
            "type": "function",
            "function": {
                "name": name,
                "description": text.text(rng, 24).strip(),
                "parameters": {"type": "object", "properties": properties, "required": sorted(properties)[:1]},
            },
        }
        tools.append(tool)
        size += len(json.dumps(tool))
    return "\n".join(json.dumps(tool) for tool in tools)


def agent_workload(
    knobs: AgentKnobs, salt: str, cycle: bool, order: str = "random", script: Sequence[int] | None = None
) -> Workload:
    system = {
        "role": "system",
        "content": "You are an agent. Call one of these tools per step and read its result.\n"
        + tool_definitions(salt, knobs.tool_tokens),
    }

    def task(session: int) -> list[Message]:
        opening = text.text(text.rng_for(salt, "agent", session, 0), knobs.step_tokens)
        return [system, {"role": "user", "content": opening}]

    def tool_result(session: int, step: int) -> Message:
        result = text.text(text.rng_for(salt, "agent", session, step), knobs.step_tokens)
        return {"role": "user", "content": "Tool result:" + result}

    if script is not None:
        return ScriptedSessions(script, output_tokens=knobs.output_tokens, opening=task, follow_up=tool_result)
    return SessionWorkload(
        sessions=knobs.sessions,
        turns=knobs.steps,
        output_tokens=knobs.output_tokens,
        opening=task,
        follow_up=tool_result,
        cycle=cycle,
        ready=ready_sessions(order, salt),
    )


def trace_workload(records: list[TraceRecord], salt: str, block_tokens: int = BLOCK_TOKENS) -> IndependentWorkload:
    """One request per record, in order; the trace is not repeated (its clock has an end)."""
    builder = PromptBuilder(salt, block_tokens)

    def requests() -> Iterator[RequestSpec]:
        for index, record in enumerate(records):
            messages = [{"role": "user", "content": builder.prompt(record, index)}]
            yield RequestSpec(messages, max(record.output_length, 1))

    return IndependentWorkload(requests(), len(records))


def build_workload(
    config: BenchConfig,
    salt: str,
    *,
    cycle: bool,
    records: list[TraceRecord] | None = None,
    min_sessions: int = 0,
) -> Workload:
    """The workload ``config`` names, its text derived from ``salt``; ``cycle`` lets it run past one pass.

    ``min_sessions`` raises the number of live chat or agent sessions: a closed loop of N workers needs N
    sessions, or the sessions (not the concurrency) would bound the requests in flight.
    """
    kind = config.workload_kind
    if kind == "gsp":
        return gsp_workload(config.gsp, salt, cycle)
    if kind == "chat":
        chat = dataclasses.replace(config.chat, sessions=max(config.chat.sessions, min_sessions))
        return chat_workload(chat, salt, cycle, config.session_order, config.session_script)
    if kind == "agent":
        agent = dataclasses.replace(config.agent, sessions=max(config.agent.sessions, min_sessions))
        return agent_workload(agent, salt, cycle, config.session_order, config.session_script)
    if records is None:
        raise ValueError("a trace workload needs its records")
    return trace_workload(records, salt, config.trace_block_tokens)

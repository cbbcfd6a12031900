"""How hard a chat request looks, from cheap surface features, so a route can spill hard ones to a frontier model.

Pure and fast (tens of microseconds for a typical request): C-speed passes over the request's text (byte
translation, word sets, substring counts, two short regexes), no model, no network. The score is a logistic model
over named features; ``ComplexityModel`` is the plug-in point for a learned one. The features are proxies (code,
math, proof and planning cues, tools, depth, length), so the score says "looks like the kind of request small
models often get wrong", not "is hard".
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

DEFAULT_THRESHOLD = 0.5
MAX_SCAN_CHARS = 4096
"""Longer prompts are scanned at their head and tail only, so cost stays bounded; length still counts in full."""

FEATURE_NAMES = (
    "length",
    "system_length",
    "turns",
    "code_blocks",
    "code_syntax",
    "stack_trace",
    "math_markup",
    "math_terms",
    "arithmetic",
    "proof",
    "reasoning",
    "constraints",
    "simple_ask",
    "tools",
    "tool_turns",
)

MONOTONE_FEATURES = frozenset(FEATURE_NAMES) - {"simple_ask", "system_length"}
"""Cues of complexity: more of one must never lower the score."""

_ASCII_LETTERS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_WORD_BYTES = bytes((b | 32) if b in _ASCII_LETTERS else 32 for b in range(256))
"""Lower-cases ASCII letters and blanks everything else, so ``split()`` yields words at C speed."""
_ARITH_BYTES = bytes(
    48 if 48 <= b <= 57 else 43 if b in b"+*/^=" else b if b in b" -" else 97 if b in _ASCII_LETTERS else 46
    for b in range(256)
)
"""Digits become 0 and operators +, so ``0+0`` counts numbers with operators; a bare ``0-0`` is a date or range."""


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_CODE_WORDS = _words(
    "def elif lambda impl fn func struct nullptr println printf malloc calloc async await const void bool typename "
    "usestate useeffect cout endl isinstance kwargs args len std sizeof goroutine goroutines pytest npm"
)
_STACK_WORDS = _words(
    "traceback exception exceptions segfault sigsegv sigabrt oomkilled errno stacktrace backtrace valgrind panicked "
    "crashloopbackoff"
)
_LATEX_COMMANDS = _words(
    "frac dfrac tfrac sqrt sum int prod lim cdot times le ge leq geq neq equiv pmod bmod mod mathbf mathbb mathcal "
    "begin end left right lfloor rfloor lceil rceil binom pi alpha beta gamma delta theta lambda sigma omega infty in "
    "to circ displaystyle log ln sin cos tan det partial nabla vec overline hat angle triangle perp"
)
_MATH_TERMS = _words(
    "integer integers prime primes polynomial polynomials divisor divisors divisible remainder modulo matrix matrices "
    "eigenvalue eigenvalues determinant derivative integral probability irrational rational equation equations "
    "inequality triangle circle circles radius tangent orthocenter sequence converge converges diverge diverges "
    "abelian cyclic isomorphic homomorphism subgroup vertices bipartite permutation parity asymptotic lagrangian"
)
_PROOF_WORDS = _words(
    "prove proves proof proofs lemma theorem corollary iff contradiction induction qed wlog uncountable undecidable"
)
_REASONING_WORDS = _words(
    "derive derivation derives compare comparing comparison contrast tradeoff tradeoffs analyse analyze analysis "
    "evaluate justify design designing architect architecture scale scalable scalability scaling optimise optimize "
    "optimisation optimization complexity reconcile investigate diagnose critically implications strategy strategies "
    "plan consistency consistent concurrency concurrent race deadlock deadlocks correctness efficient efficiently "
    "algorithm algorithms propose redesign migrate migration sensitivity latency throughput distributed idempotency "
    "idempotent failover replication sharding shard cache caching availability fault partition partitioning replica "
    "replicas consensus microservices autoscaling quota quotas tenant rebalancing deduplication retries backpressure"
)
_CONSTRAINT_WORDS = _words("must exactly constraint constraints without ensure guarantee guarantees limit limits bound")
_SIMPLE_WORDS = _words(
    "translate translation rewrite rephrase paraphrase summarize summarise summary tldr gist grammar spelling "
    "proofread polish shorten headline hi hello hey thanks thank bye joke sort convert reformat capitalize capitalise "
    "weather timer"
)
# Phrases as (word that must be present, phrase to count): the word gates the scan, so absent phrases cost nothing.
_MATH_PHRASES = (("real", "real number"), ("complex", "complex number"), ("fraction", "common fraction"))
_PROOF_PHRASES = (("show", "show that"), ("only", "if and only if"), ("generality", "without loss of generality"))
_REASONING_PHRASES = (
    ("step", "step by step"),
    ("step", "step-by-step"),
    ("cause", "root cause"),
    ("cons", "pros and cons"),
    ("explain", "explain why"),
    ("explain", "explain how"),
    ("trade", "trade-off"),
)
_CONSTRAINT_PHRASES = (("most", "at most"), ("least", "at least"), ("than", "no more than"))
_SIMPLE_PHRASES = (
    ("say", "how do you say"),
    ("say", "how would i say"),
    ("capital", "capital of"),
    ("wrote", "who wrote"),
    ("painted", "who painted"),
    ("fact", "fun fact"),
    ("morning", "good morning"),
    ("tl", "tl;dr"),
)
_CODE_TOKENS = ("==", "=>", "::", ";\n", "{\n", "\n    ", "()", "self.", ">>> ")
_STACK_PHRASES = (
    ("error", "error:"),
    ("error", "error["),
    ("error", "fatal error"),
    ("panic", "panic:"),
    ("at", "\tat "),
    ("at", "    at "),
    ("file", '  file "'),
)
_LATEX = re.compile(r"\\([a-zA-Z]+)")
_LIST_ITEM = re.compile(r"\n[ \t]*(?:\d{1,2}[.)]|[-*\u2022]) ")
_MATH_SYMBOLS = re.compile(
    "[\u2211\u222b\u220f\u221a\u2264\u2265\u2260\u2261\u2208\u2200\u2203\u2283\u00b7\u00d7\u00f7\u03c0\u221e]"
)


class ComplexityFeatures(NamedTuple):
    """Raw counts read from one request; ``vector`` turns them into the model's inputs."""

    chars: int = 0
    """Characters of every non-system message (and of a completion ``prompt``)."""
    system_chars: int = 0
    """System (and developer) prompts are measured, not scanned: their rules read like constraints on every ask."""
    turns: int = 0
    """User and assistant messages: a long conversation carries more context to keep straight."""
    code_blocks: int = 0
    code_syntax: int = 0
    stack_trace: int = 0
    math_markup: int = 0
    math_terms: int = 0
    arithmetic: int = 0
    proof: int = 0
    reasoning: int = 0
    constraints: int = 0
    simple_ask: int = 0
    """Cues of an easy ask (translate, summarize, greet) in the last user message only: it names the task."""
    tools: int = 0
    tool_turns: int = 0
    """Tool results and assistant tool calls already in the conversation: an agent loop in progress."""

    def vector(self) -> tuple[float, ...]:
        """Model inputs in ``FEATURE_NAMES`` order: log-damped so the first occurrences count most."""
        log1p = math.log1p
        return (
            math.log2(1.0 + self.chars / 256.0),
            math.log2(1.0 + self.system_chars / 1024.0),
            log1p(max(0, self.turns - 1)),
            float(min(self.code_blocks, 3)),
            log1p(self.code_syntax),
            log1p(self.stack_trace),
            log1p(self.math_markup),
            log1p(self.math_terms),
            log1p(self.arithmetic),
            log1p(self.proof),
            log1p(self.reasoning),
            log1p(self.constraints),
            log1p(self.simple_ask),
            log1p(self.tools),
            log1p(self.tool_turns),
        )


class ComplexityVerdict(NamedTuple):
    score: float
    """In [0, 1]; compare with a route's threshold."""
    features: ComplexityFeatures
    top_reasons: tuple[str, ...]
    """Names of the features that pushed the score up most, strongest first, for logs and headers."""


class ComplexityModel(Protocol):
    """Maps features to a score in [0, 1]: the plug-in point for a learned model."""

    def score(self, features: ComplexityFeatures) -> float: ...


@runtime_checkable
class ExplainingModel(Protocol):
    """A model that can also say how much each feature added to its score (in ``FEATURE_NAMES`` order)."""

    def score(self, features: ComplexityFeatures) -> float: ...

    def contributions(self, features: ComplexityFeatures) -> tuple[float, ...]: ...


@dataclass(frozen=True, slots=True)
class LogisticModel:
    """``sigmoid(bias + weights . features.vector())``: transparent, and its terms are its explanation."""

    weights: tuple[float, ...]
    bias: float

    def __post_init__(self) -> None:
        if len(self.weights) != len(FEATURE_NAMES):
            raise ValueError(f"expected {len(FEATURE_NAMES)} weights, got {len(self.weights)}")

    @classmethod
    def from_mapping(cls, weights: Mapping[str, float], bias: float) -> LogisticModel:
        """Weights by feature name; unnamed features weigh 0, unknown names raise ``KeyError``."""
        unknown = set(weights) - set(FEATURE_NAMES)
        if unknown:
            raise KeyError(f"unknown features: {sorted(unknown)}")
        return cls(tuple(float(weights.get(name, 0.0)) for name in FEATURE_NAMES), bias)

    def contributions(self, features: ComplexityFeatures) -> tuple[float, ...]:
        return tuple(map(operator.mul, self.weights, features.vector()))

    def score(self, features: ComplexityFeatures) -> float:
        return _sigmoid(self.bias + sum(map(operator.mul, self.weights, features.vector())))


HAND_WEIGHTS = LogisticModel.from_mapping(
    {
        "length": 1.3,
        "system_length": 0.0,
        "turns": 0.3,
        "code_blocks": 0.2,
        "code_syntax": 0.05,
        "stack_trace": 0.6,
        "math_markup": 1.3,
        "math_terms": 1.0,
        "arithmetic": 1.2,
        "proof": 1.9,
        "reasoning": 1.6,
        "constraints": 0.7,
        "simple_ask": -1.7,
        "tools": 1.2,
        "tool_turns": 0.1,
    },
    bias=-2.0,
)
"""Set by hand from what each cue means; see tests/bench/complexity_eval.py for how it scores."""


@dataclass(frozen=True, slots=True)
class ComplexityClassifier:
    """Scores requests with ``model``; reasons come from the model when it explains itself, else from hand weights."""

    model: ComplexityModel = HAND_WEIGHTS
    max_reasons: int = 3
    min_contribution: float = 0.3
    """A feature adding less than this to the log-odds is not named as a reason."""
    _explainer: ExplainingModel = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Decided once: a runtime-checkable isinstance costs microseconds, too much to pay per request.
        explainer = self.model if isinstance(self.model, ExplainingModel) else HAND_WEIGHTS
        object.__setattr__(self, "_explainer", explainer)

    def score(self, payload: Any) -> ComplexityVerdict:
        features = extract_features(payload)
        return ComplexityVerdict(_clamp(self.model.score(features)), features, self._reasons(features))

    def is_complex(self, payload: Any, threshold: float = DEFAULT_THRESHOLD) -> bool:
        """Whether the request needs the frontier tier under a route's ``threshold``."""
        return _clamp(self.model.score(extract_features(payload))) >= threshold

    def _reasons(self, features: ComplexityFeatures) -> tuple[str, ...]:
        floor = self.min_contribution
        strong = [
            (value, name)
            for value, name in zip(self._explainer.contributions(features), FEATURE_NAMES, strict=True)
            if value >= floor
        ]
        strong.sort(reverse=True)
        return tuple(name for _, name in strong[: self.max_reasons])


DEFAULT_CLASSIFIER = ComplexityClassifier()


def is_complex(payload: Any, threshold: float = DEFAULT_THRESHOLD) -> bool:
    """Whether the default classifier sends this request to the frontier tier at ``threshold``."""
    return DEFAULT_CLASSIFIER.is_complex(payload, threshold)


def extract_features(payload: Any) -> ComplexityFeatures:
    """Count the cues in an OpenAI chat (or completion) request; malformed parts are skipped, never raised on."""
    if not isinstance(payload, Mapping):
        return ComplexityFeatures()
    texts: list[str] = []
    system_chars = turns = tool_turns = 0
    last_user = ""
    for message in _messages(payload):
        role = message.get("role")
        text = _content_text(message.get("content"))
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            tool_turns += len(calls)
        if role in ("system", "developer"):
            system_chars += len(text)
            continue
        if role in ("tool", "function"):
            tool_turns += 1
        elif role in ("user", "assistant"):
            turns += 1
        if role == "user":
            last_user = text
        texts.append(text)
    prompt = _content_text(payload.get("prompt"))
    if prompt:
        texts.append(prompt)
        last_user = prompt
        turns = max(turns, 1)
    body = "\n".join(texts)
    return _scan(body, last_user, system_chars, turns, _tool_count(payload), tool_turns)


def fit_logistic(
    samples: Sequence[ComplexityFeatures],
    labels: Sequence[bool],
    l2: float = 1.0,
    monotone: bool = True,
) -> LogisticModel:
    """Fit weights by L2-penalised Newton's method, in pure Python (no numpy here).

    The penalty keeps weights finite when the items are separable, as a small labelled set often is. With
    ``monotone``, a cue of complexity that comes out with a negative weight is pinned to 0 and the rest refit, so
    adding code or tools never lowers a score because of how one data set happened to be composed.
    """
    rows = [(1.0, *s.vector()) for s in samples]
    ys = [1.0 if y else 0.0 for y in labels]
    active = list(range(len(FEATURE_NAMES) + 1))
    while True:
        beta = _newton(rows, ys, active, l2)
        wrong = [i for i in active if i and monotone and FEATURE_NAMES[i - 1] in MONOTONE_FEATURES and beta[i] < 0]
        if not wrong:
            return LogisticModel(tuple(beta[1:]), beta[0])
        active = [i for i in active if i not in wrong]


def _newton(rows: Sequence[Sequence[float]], ys: Sequence[float], active: Sequence[int], l2: float) -> list[float]:
    """Logistic regression on the ``active`` columns of ``rows`` (column 0 is the unpenalised bias)."""
    beta = [0.0] * len(rows[0])
    size = len(active)
    for _ in range(50):
        gradient = [l2 * beta[c] if c else 0.0 for c in active]
        hessian = [[l2 if i == j and active[i] else 0.0 for j in range(size)] for i in range(size)]
        for row, y in zip(rows, ys, strict=True):
            x = [row[c] for c in active]
            p = _sigmoid(sum(beta[c] * v for c, v in zip(active, x, strict=True)))
            weight = max(p * (1.0 - p), 1e-9)
            for i in range(size):
                gradient[i] += (p - y) * x[i]
                wx = weight * x[i]
                line = hessian[i]
                for j in range(i, size):
                    line[j] += wx * x[j]
        for i in range(size):
            for j in range(i):
                hessian[i][j] = hessian[j][i]
        step = _solve(hessian, gradient)
        for c, s in zip(active, step, strict=True):
            beta[c] -= s
        if max(abs(s) for s in step) < 1e-9:
            break
    return beta


def _scan(body: str, last_user: str, system_chars: int, turns: int, tools: int, tool_turns: int) -> ComplexityFeatures:
    chars = len(body)
    body = _clip(body)
    lower = body.lower()
    raw = body.encode("utf-8", "replace")
    words = _word_set(raw)
    latex = sum(1 for command in _LATEX.findall(body) if command in _LATEX_COMMANDS)
    fences = body.count("```")
    return ComplexityFeatures(
        chars=chars,
        system_chars=system_chars,
        turns=turns,
        code_blocks=(fences + 1) // 2,
        code_syntax=len(words & _CODE_WORDS) + sum(map(body.count, _CODE_TOKENS)),
        stack_trace=len(words & _STACK_WORDS) + _phrases(_STACK_PHRASES, words, lower),
        math_markup=latex + (body.count("$") // 2 if latex else 0) + _math_symbols(body),
        math_terms=len(words & _MATH_TERMS) + _phrases(_MATH_PHRASES, words, lower),
        arithmetic=_arithmetic(raw, body),
        proof=len(words & _PROOF_WORDS) + _phrases(_PROOF_PHRASES, words, lower),
        reasoning=len(words & _REASONING_WORDS) + _phrases(_REASONING_PHRASES, words, lower),
        constraints=len(_LIST_ITEM.findall(body))
        + len(words & _CONSTRAINT_WORDS)
        + _phrases(_CONSTRAINT_PHRASES, words, lower)
        + body.count("10^")
        + lower.count("o("),
        simple_ask=_simple_ask(last_user, body, words, lower),
        tools=tools,
        tool_turns=tool_turns,
    )


def _clip(text: str) -> str:
    """The head and tail of a long text: the instructions and the question usually sit at the ends."""
    if len(text) <= MAX_SCAN_CHARS:
        return text
    head = MAX_SCAN_CHARS // 4
    return text[:head] + "\n" + text[len(text) - (MAX_SCAN_CHARS - head) :]


def _word_set(raw: bytes) -> set[str]:
    return set(raw.translate(_WORD_BYTES).decode("ascii").split())


def _phrases(phrases: tuple[tuple[str, str], ...], words: set[str], lower: str) -> int:
    return sum([lower.count(phrase) for gate, phrase in phrases if gate in words])


def _arithmetic(raw: bytes, body: str) -> int:
    shape = raw.translate(_ARITH_BYTES)
    operators = shape.count(b"0+0") + shape.count(b"0 + 0") + shape.count(b"0 - 0")
    return operators + body.count("^") + body.count("<=") + body.count(">=")


def _math_symbols(body: str) -> int:
    return 0 if body.isascii() else len(_MATH_SYMBOLS.findall(body))


def _simple_ask(last_user: str, body: str, body_words: set[str], body_lower: str) -> int:
    """Easy-task cues in the prose of the last user message: the ask names the task, pasted code does not.

    Reuses the body's scan when that message is all there is and holds no code, the common case.
    """
    last_user = _clip(last_user)
    if "```" in last_user:
        last_user = "\n".join(last_user.split("```")[::2])
    elif last_user == body:
        return len(body_words & _SIMPLE_WORDS) + _phrases(_SIMPLE_PHRASES, body_words, body_lower)
    words = _word_set(last_user.encode("utf-8", "replace"))
    return len(words & _SIMPLE_WORDS) + _phrases(_SIMPLE_PHRASES, words, last_user.lower())


def _messages(payload: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return ()
    return (m for m in messages if isinstance(m, Mapping))


def _content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content-part list (images and audio add nothing)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""


def _tool_count(payload: Mapping[str, Any]) -> int:
    count = 0
    for key in ("tools", "functions"):
        value = payload.get(key)
        if isinstance(value, list):
            count += len(value)
    return count


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _clamp(value: float) -> float:
    value = float(value)
    if value != value:  # NaN from a misbehaving plug-in model counts as "not complex"
        return 0.0
    return min(1.0, max(0.0, value))


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting; the L2 penalty keeps the matrix well conditioned."""
    size = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(size)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        lead = rows[col][col]
        if abs(lead) < 1e-12:
            continue
        for r in range(col + 1, size):
            factor = rows[r][col] / lead
            if factor:
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    solution = [0.0] * size
    for i in reversed(range(size)):
        lead = rows[i][i]
        if abs(lead) >= 1e-12:
            solution[i] = (rows[i][size] - sum(rows[i][j] * solution[j] for j in range(i + 1, size))) / lead
    return solution

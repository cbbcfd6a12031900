"""How hard a chat request's ask looks, from cheap surface features, so a route can spill hard ones to a frontier model.

The score reads the ask, not the context that comes with it: the last user turn (or a completion's ``prompt``), the
task cues in it and the tools offered. A long system prompt, chat history, tool results or a pasted document add
nothing, because long shared prefixes are what prefix-cached replicas serve cheapest and they say little about how
hard the question is. A long last turn is read at its ends (``ask_window``): instructions and questions sit there,
the pasted material in between.

Pure and fast (tens of microseconds a request): C-speed passes over the ask's text (byte translation, word sets,
substring counts, short regexes), no model, no network. The score is a logistic model over named features, fitted on
the train split of an external evaluation set; ``ComplexityModel`` is the plug-in point for another one. The features
are proxies (code, math, proof and reasoning cues, asks to build software, the ask's length, tools), so the score says
"looks like the kind of request small models often get wrong", not "is hard".
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

DEFAULT_THRESHOLD = 0.5
ASK_WHOLE_CHARS = 1500
"""A last turn up to this long is all ask; a longer one is read at its ends only (``ask_window``)."""
ASK_HEAD_CHARS = 400
ASK_TAIL_CHARS = 800
"""At most this much of each end: the head stops at its first line break, the tail at its last blank line."""

FEATURE_NAMES = (
    "ask_length",
    "code_blocks",
    "code_syntax",
    "code_task",
    "stack_trace",
    "math_markup",
    "math_terms",
    "arithmetic",
    "proof",
    "reasoning",
    "constraints",
    "simple_ask",
    "tools",
    "build_task",
    "inline_code",
)

EASING_FEATURES = frozenset({"simple_ask"})
"""Cues of an easy ask: more of one must never raise the score."""
MONOTONE_FEATURES = frozenset(FEATURE_NAMES) - EASING_FEATURES
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
_CODE_TASK_WORDS = _words(
    "program programs programming implement implementation coding compile compiler debug refactor "
    "java javascript typescript rust golang kotlin php scala haskell ocaml sql mysql html css svg xml "
    "react django laravel kubernetes docker bash powershell regex api assembly nasm cuda opengl app apps "
    "query database excel notebook kernel userspace runtime cpu gpu server linux shell git recursion "
    "recursive pandas numpy dataframe matplotlib seaborn"
)
_CODE_TASK_PHRASES = (
    ("c", "c++"),
    ("c", "c#"),
    ("code", "write code"),
    ("code", "this code"),
    ("code", "my code"),
    ("code", "code that"),
    ("write", "write a function"),
    ("write", "write a program"),
)
_STACK_WORDS = _words(
    "traceback exception exceptions segfault sigsegv sigabrt oomkilled errno stacktrace backtrace valgrind panicked "
    "crashloopbackoff typeerror valueerror keyerror nullpointerexception bug bugs"
)
_LATEX_COMMANDS = _words(
    "frac dfrac tfrac sqrt sum int prod lim cdot times le ge leq geq neq equiv pmod bmod mod mathbf mathbb mathcal "
    "begin end left right lfloor rfloor lceil rceil binom pi alpha beta gamma delta theta lambda sigma omega infty in "
    "to circ displaystyle log ln sin cos tan det partial nabla vec overline hat angle triangle perp"
)
_MATH_TERMS = _words(
    "integer integers primes polynomial polynomials divisor divisors divisible remainder modulo matrix matrices "
    "eigenvalue eigenvalues determinant derivative integral probability irrational rational equation equations "
    "inequality triangle circle circles radius tangent orthocenter sequence converge converges diverge diverges "
    "abelian cyclic isomorphic homomorphism subgroup vertices bipartite permutation parity asymptotic lagrangian "
    "angle angles perimeter polygon parabola ellipse hyperbola logarithm factorial gcd lcm coefficient coefficients "
    "quadratic cubic compute fraction distinguishable congruent reciprocal variance deviation interval intervals "
    "regression"
)
_PROOF_WORDS = _words(
    "prove proves proof proofs lemma theorem corollary iff contradiction induction qed wlog uncountable undecidable"
)
_REASONING_WORDS = _words(
    "derive derivation derives compare comparing comparison contrast tradeoff tradeoffs analyse analyze analysis "
    "evaluate justify design designing architect architecture scale scalable scalability scaling optimise optimize "
    "optimisation optimization complexity reconcile investigate diagnose critically implications strategy strategies "
    "consistency consistent concurrency concurrent deadlock deadlocks correctness efficient efficiently "
    "algorithm algorithms propose redesign migrate migration sensitivity latency throughput distributed idempotency "
    "idempotent failover replication sharding shard cache caching availability fault partition partitioning replica "
    "replicas consensus microservices autoscaling quota quotas tenant rebalancing deduplication retries backpressure "
    "logic logical logically deduce deduction deductive deductively premise premises valid invalid argument fallacy "
    "causation causal infer inference"
)
_CONSTRAINT_WORDS = _words("must exactly constraint constraints without ensure guarantee guarantees limit limits bound")
_SIMPLE_WORDS = _words(
    "translate translation rewrite rephrase paraphrase summarize summarise summary tldr gist grammar spelling "
    "proofread polish shorten headline hi hello hey thanks thank bye joke sort convert reformat capitalize capitalise "
    "weather timer"
)
# Phrases as (word that must be present, phrase to count): the word gates the scan, so absent phrases cost nothing.
_MATH_PHRASES = (
    ("real", "real number"),
    ("complex", "complex number"),
    ("fraction", "common fraction"),
    ("prime", "prime number"),
    ("prime", "prime factor"),
    ("prime", "is prime"),
    ("ways", "how many ways"),
    ("ways", "in how many"),
    ("expected", "expected value"),
)
_PROOF_PHRASES = (("show", "show that"), ("only", "if and only if"), ("generality", "without loss of generality"))
_REASONING_PHRASES = (
    ("step", "step by step"),
    ("step", "step-by-step"),
    ("cause", "root cause"),
    ("race", "race condition"),
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
    ("fix", "fix this"),
    ("fix", "fix the"),
    ("error", "this error"),
)
_BUILD_VERBS = _words("write implement create build make develop generate code design program")
_DELIVERABLES = _words(
    "function functions program programs script scripts code app application class method query algorithm api bot "
    "tool game library module component service parser regex macro plugin extension server simulation notebook "
    "dockerfile pipeline cli website webpage"
)
_BUILD_ASK = re.compile(
    r"\b(?:write|implement|create|build|make|develop|generate|design|program)"
    r"(?:\s+me)?(?:\s+(?:a|an|the|some|this|that|my|our)(?:\s+[\w#+.-]+){0,3}?)?\s+"
    r"(?:function|program|script|code|app|application|class|method|query|algorithm|api|bot|tool|game|library|module"
    r"|component|service|parser|regex|macro|plugin|extension|server|simulation|notebook|dockerfile|pipeline|cli"
    r"|website|webpage)s?\b"
)
_LATEX = re.compile(r"\\([a-zA-Z]+)")
_INLINE_MATH = re.compile(r"\$(?:[^\s$]|[^\s$][^$\n]{0,200}?[^\s$])\$")
_LIST_ITEM = re.compile(r"\n[ \t]*(?:\d{1,2}[.)]|[-*\u2022]) ")
_MATH_SYMBOLS = re.compile(
    "[\u2211\u222b\u220f\u221a\u2264\u2265\u2260\u2261\u2208\u2200\u2203\u2283\u00b7\u00d7\u00f7\u03c0\u221e]"
)


class ComplexityFeatures(NamedTuple):
    """Raw counts read from one request's ask; ``vector`` turns them into the model's inputs."""

    ask_chars: int = 0
    """Characters of the ask as read: the last user turn, or its two ends when it is long."""
    context_chars: int = 0
    """Everything else (system prompts, history, tool results, the middle of a long last turn): measured, not scored."""
    turns: int = 0
    """User and assistant messages, for logs: how deep the conversation is says nothing of the ask."""
    code_blocks: int = 0
    """Fenced blocks in the ask (one left open at a window's edge counts too)."""
    code_syntax: int = 0
    code_task: int = 0
    """Words that ask for software work (program, implement, a language's name)."""
    stack_trace: int = 0
    math_markup: int = 0
    math_terms: int = 0
    arithmetic: int = 0
    proof: int = 0
    reasoning: int = 0
    constraints: int = 0
    simple_ask: int = 0
    """Cues of an easy ask (translate, summarize, greet) in the ask's prose, outside code blocks."""
    tools: int = 0
    """Tools the request offers: the ask may need them, however long their definitions are."""
    build_task: int = 0
    """Asks to build a piece of software ("write a function that", "implement", "create an app"), whatever its topic."""
    inline_code: int = 0
    """Code syntax in the ask's prose, outside fences: code the asker wrote or pasted into the question itself."""

    def vector(self) -> tuple[float, ...]:
        """Model inputs in ``FEATURE_NAMES`` order: log-damped so the first occurrences count most."""
        log1p = math.log1p
        return (
            math.log2(1.0 + self.ask_chars / 256.0),
            float(min(self.code_blocks, 3)),
            log1p(self.code_syntax),
            log1p(self.code_task),
            log1p(self.stack_trace),
            log1p(self.math_markup),
            log1p(self.math_terms),
            log1p(self.arithmetic),
            log1p(self.proof),
            log1p(self.reasoning),
            log1p(self.constraints),
            log1p(self.simple_ask),
            log1p(self.tools),
            log1p(self.build_task),
            log1p(self.inline_code),
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
        "ask_length": 0.4,
        "code_blocks": 0.2,
        "code_syntax": 0.1,
        "code_task": 2.6,
        "stack_trace": 1.4,
        "math_markup": 2.2,
        "math_terms": 2.6,
        "arithmetic": 2.2,
        "proof": 1.5,
        "reasoning": 2.1,
        "constraints": 0.3,
        "simple_ask": -0.5,
        "tools": 0.2,
    },
    bias=-1.8,
)
"""The earlier weights, set by hand: kept for comparison (``--fit``) and as the explainer of last resort. They
predate ``build_task`` and ``inline_code``, which weigh 0 here. ``simple_ask`` is negative by design."""


FITTED_WEIGHTS = LogisticModel.from_mapping(
    {
        "ask_length": 0.740,
        "code_blocks": 0.000,
        "code_syntax": 0.000,
        "code_task": 3.456,
        "stack_trace": 3.134,
        "math_markup": 3.642,
        "math_terms": 4.015,
        "arithmetic": 2.607,
        "proof": 0.000,
        "reasoning": 2.610,
        "constraints": 0.436,
        "simple_ask": 0.000,
        "tools": 0.000,
        "build_task": 4.026,
        "inline_code": 0.639,
    },
    bias=-2.492,
)
"""The default: ``fit_logistic`` (monotone, its default penalty) on the whole train split of the external evaluation
set, rounded; the unit tests refit it to check. The features, the penalty and the sign rules were chosen by 5-fold
cross-validation on that split (``python -m tests.bench.complexity_eval --cv``). Weights the fit pins to 0 (proof
words, code syntax, tools, easy-ask cues) add nothing on this set beyond the cues that come with them. A lone strong
cue in a short ask lands near or past the threshold; an ask of any length with no cue stays below 0.4, since the
window caps ``ask_length``."""


@dataclass(frozen=True, slots=True)
class ComplexityClassifier:
    """Scores requests with ``model``; reasons come from the model when it explains itself, else the fitted weights."""

    model: ComplexityModel = FITTED_WEIGHTS
    max_reasons: int = 3
    min_contribution: float = 0.3
    """A feature adding less than this to the log-odds is not named as a reason."""
    _explainer: ExplainingModel = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Decided once: a runtime-checkable isinstance costs microseconds, too much to pay per request.
        explainer = self.model if isinstance(self.model, ExplainingModel) else FITTED_WEIGHTS
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
    """Count the cues in an OpenAI chat (or completion) request's ask; malformed parts are skipped, never raised on."""
    return ask_text(payload)[1]


def ask_text(payload: Any) -> tuple[str, ComplexityFeatures]:
    """The ask a request puts (the window of its last user turn, or of a completion's prompt) and its cue features."""
    if not isinstance(payload, Mapping):
        return "", ComplexityFeatures()
    total = turns = 0
    ask = ""
    for message in _messages(payload):
        role = message.get("role")
        text = _content_text(message.get("content"))
        total += len(text)
        if role == "user":
            ask = text
            turns += 1
        elif role == "assistant":
            turns += 1
    prompt = _content_text(payload.get("prompt"))
    if prompt:
        total += len(prompt)
        ask = prompt
        turns = max(turns, 1)
    window = ask_window(ask)
    return window, _scan(window, total - len(window), turns, _tool_count(payload))


def ask_window(text: str) -> str:
    """The part of a last turn that says what is asked: all of a short one, the two ends of a long one.

    The head is the first line, where an instruction ("Fix this warning:", "Summarize this:") opens what is
    pasted after it; the tail is the last paragraph (or else the last line), where a question follows what was
    pasted before it. Neither reaches into the pasted material unless a line or paragraph runs on.
    """
    if len(text) <= ASK_WHOLE_CHARS:
        return text
    head = text[:ASK_HEAD_CHARS]
    cut = head.find("\n")
    if cut >= 0:
        head = head[:cut]
    tail = text[len(text) - ASK_TAIL_CHARS :].rstrip()
    cut = tail.rfind("\n\n")
    if cut < 0:
        cut = tail.rfind("\n")
    if cut >= 0:
        tail = tail[cut + 1 :].lstrip()
    return head + "\n" + tail


def fit_logistic(
    samples: Sequence[ComplexityFeatures],
    labels: Sequence[bool],
    l2: float = 0.1,
    monotone: bool = True,
) -> LogisticModel:
    """Fit weights by L2-penalised Newton's method, in pure Python (no numpy here).

    The penalty keeps weights finite when the items are separable, as a small labelled set often is; its default
    was chosen by cross-validation on the evaluation set's train split (a larger one shrank the cues). With
    ``monotone``, a cue of complexity that comes out with a negative weight (or a cue of an easy ask with a positive
    one) is pinned to 0 and the rest refit, so adding code or tools never lowers a score, nor asking to translate
    raises it, because of how one data set happened to be composed.
    """
    rows = [(1.0, *s.vector()) for s in samples]
    ys = [1.0 if y else 0.0 for y in labels]
    active = list(range(len(FEATURE_NAMES) + 1))
    while True:
        beta = _newton(rows, ys, active, l2)
        wrong = [i for i in active if i and monotone and _against_sign(FEATURE_NAMES[i - 1], beta[i])]
        if not wrong:
            return LogisticModel(tuple(beta[1:]), beta[0])
        active = [i for i in active if i not in wrong]


def _against_sign(name: str, weight: float) -> bool:
    return weight < 0 if name in MONOTONE_FEATURES else weight > 0


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


def _scan(ask: str, context_chars: int, turns: int, tools: int) -> ComplexityFeatures:
    """Code cues are read from the whole ask; task cues from its prose, since code pasted into an ask is material."""
    lower = ask.lower()
    raw = ask.encode("utf-8", "replace")
    words = _word_set(raw)
    fences = ask.count("```")
    if fences:
        prose = "\n".join(ask.split("```")[::2])
        prose_lower = prose.lower()
        prose_raw = prose.encode("utf-8", "replace")
        prose_words = _word_set(prose_raw)
    else:
        prose, prose_lower, prose_raw, prose_words = ask, lower, raw, words
    code_syntax = len(words & _CODE_WORDS) + sum(map(ask.count, _CODE_TOKENS))
    inline_code = len(prose_words & _CODE_WORDS) + sum(map(prose.count, _CODE_TOKENS)) if fences else code_syntax
    latex = sum(1 for command in _LATEX.findall(prose) if command in _LATEX_COMMANDS)
    return ComplexityFeatures(
        ask_chars=len(ask),
        context_chars=context_chars,
        turns=turns,
        code_blocks=(fences + 1) // 2,
        code_syntax=code_syntax,
        code_task=len(prose_words & _CODE_TASK_WORDS) + _phrases(_CODE_TASK_PHRASES, prose_words, prose_lower),
        stack_trace=len(words & _STACK_WORDS) + _phrases(_STACK_PHRASES, words, lower),
        math_markup=latex + _inline_math(prose) + _math_symbols(prose),
        math_terms=len(prose_words & _MATH_TERMS) + _phrases(_MATH_PHRASES, prose_words, prose_lower),
        arithmetic=_arithmetic(prose_raw, prose),
        proof=len(prose_words & _PROOF_WORDS) + _phrases(_PROOF_PHRASES, prose_words, prose_lower),
        reasoning=len(prose_words & _REASONING_WORDS) + _phrases(_REASONING_PHRASES, prose_words, prose_lower),
        constraints=len(_LIST_ITEM.findall(prose))
        + len(prose_words & _CONSTRAINT_WORDS)
        + _phrases(_CONSTRAINT_PHRASES, prose_words, prose_lower)
        + prose.count("10^")
        + prose_lower.count("o("),
        simple_ask=len(prose_words & _SIMPLE_WORDS) + _phrases(_SIMPLE_PHRASES, prose_words, prose_lower),
        tools=tools,
        build_task=_build_task(prose_words, prose_lower),
        inline_code=inline_code,
    )


def _build_task(words: set[str], lower: str) -> int:
    """A build verb, then a software deliverable (right after it, or an article and up to three words on).

    Topic-free, and tight enough that a verb and a noun in a run of unrelated words do not pair up; "complete this
    function" is not one.
    """
    if words.isdisjoint(_BUILD_VERBS) or words.isdisjoint(_DELIVERABLES):
        return 0
    return len(_BUILD_ASK.findall(lower))


def _word_set(raw: bytes) -> set[str]:
    return set(raw.translate(_WORD_BYTES).decode("ascii").split())


def _phrases(phrases: tuple[tuple[str, str], ...], words: set[str], lower: str) -> int:
    return sum([lower.count(phrase) for gate, phrase in phrases if gate in words])


def _arithmetic(raw: bytes, text: str) -> int:
    """Numbers joined by operators (a negative operand too); a bare ``0-0`` is a date or a range, not a sum."""
    shape = raw.translate(_ARITH_BYTES)
    operators = sum(map(shape.count, (b"0+0", b"0 + 0", b"0 - 0", b"0 + -0", b"0 - -0")))
    return operators + text.count("^") + text.count("<=") + text.count(">=")


def _math_symbols(text: str) -> int:
    return 0 if text.isascii() else len(_MATH_SYMBOLS.findall(text))


def _inline_math(ask: str) -> int:
    """``$x$``-style spans: a dollar sign hugging its text on both sides, which prices ("$4 and $5") never do."""
    return len(_INLINE_MATH.findall(ask)) if "$" in ask else 0


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

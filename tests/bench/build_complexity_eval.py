"""Rebuilds the complexity evaluation set from public benchmark files, so every item can be traced and regenerated.

    python -m tests.bench.build_complexity_eval --sources DIR [--out policies/complexity_eval]

``DIR`` holds the files named in ``SOURCE_FILES`` (policies/complexity_eval/SOURCES.md says which repository and
commit each comes from). Every choice is made by rule, never by looking at an item: each category takes the first
records of its pool in the order of ``sha256("<dataset>:<record id>")``, and its label is fixed per category in
``CATEGORIES``. A source record is used once at most, as one item's ask; padding and chat history come from records
that no item asks. The split is by a hash of the item id (``split_of``), written into train.jsonl and test.jsonl.
Passages longer than needed are not cut; items of long-context categories are built to a few thousand characters.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tests.bench.complexity_eval import EVAL_DIR, split_of

Message = dict[str, Any]

SOURCE_FILES = {
    "math": "math_test.jsonl",
    "bbh": "bbh",
    "bbh_metrics": "bbh_metrics",
    "mtbench": "mt_bench_question.jsonl",
    "vicuna": "vicuna_bench_question.jsonl",
    "arena": "arena_hard_v0.1_question.jsonl",
    "gsm8k": "gsm8k_test.jsonl",
    "humaneval": "HumanEval.jsonl.gz",
    "qed": "qed-dev.jsonlines",
    "bfcl_live_simple": "bfcl/BFCL_v4_live_simple.json",
    "bfcl_live_multiple": "bfcl/BFCL_v4_live_multiple.json",
    "tau_trajectories": "tau_gpt-4o-airline.json",
    "tau_tools": "tau_tools",
}

BBH_HARD_BELOW = 60.0
"""A BBH task is hard when code-davinci-002 with chain of thought (the repo's own outputs) scored below this."""
BBH_EASY_FROM = 90.0
"""...and easy from this; tasks in between are not used."""
LONG_CONTEXT_CHARS = 3000
"""Documents and chat histories built for long-context items have at least this many characters."""
ARENA_MAX_CHARS = 4000
BFCL_TOOLS_CHARS = (2000, 8000)
"""BFCL live_multiple items whose function list (as JSON) is this long: long tool prefixes, bounded in size."""
QED_ASKS = 400
"""The first QED records by rank may be asked; the rest only pad documents, in turn, so none of them is an ask."""
TAU_LOOKUPS = frozenset({"get_user_details", "get_reservation_details", "list_all_airports"})
TAU_SHARED = ("tau-airline-policy", "tau-airline-tools")
RAG_SYSTEM = "Answer the user's question using the documents below.\n\n"
SUMMARY_ASKS = (
    "Summarize the text above in a few sentences.",
    "Give me a short summary of this.",
    "TL;DR?",
)
HUMANEVAL_ASK = "Complete the following Python function:\n```python\n{prompt}```"


class Category(NamedTuple):
    label: str
    group: str
    """``hard``, ``easy`` or ``long_context_easy``: the groups the bench reports separately."""
    rule: str


CATEGORIES: dict[str, Category] = {
    "math/level4-5": Category("complex", "hard", "MATH test problem of level 4 or 5 (of 5) -> complex"),
    "bbh/hard": Category(
        "complex", "hard", f"BBH task where code-davinci-002 + CoT scored < {BBH_HARD_BELOW:.0f}% -> complex"
    ),
    "mtbench/hard": Category("complex", "hard", "MT-bench reasoning, math or coding question (turn 1) -> complex"),
    "arena-hard": Category(
        "complex", "hard", f"Arena-Hard v0.1 prompt (selected by its authors as hard), <= {ARENA_MAX_CHARS} chars"
    ),
    "hard-in-context/system": Category(
        "complex", "hard", "a MATH level 4-5 or hard-BBH ask behind a long RAG system prompt -> complex"
    ),
    "hard-in-context/history": Category(
        "complex", "hard", "a MATH level 4-5 or hard-BBH ask after easy QED and GSM8K turns -> complex"
    ),
    "gsm8k": Category("simple", "easy", "GSM8K test word problem -> simple (grade-school arithmetic)"),
    "humaneval": Category("simple", "easy", "HumanEval function to complete -> simple (entry-level Python)"),
    "bbh/easy": Category(
        "simple", "easy", f"BBH task where code-davinci-002 + CoT scored >= {BBH_EASY_FROM:.0f}% -> simple"
    ),
    "mtbench/easy": Category(
        "simple", "easy", "MT-bench writing, roleplay, humanities or stem question (turn 1) -> simple"
    ),
    "mtbench/extraction": Category("simple", "easy", "MT-bench extraction question (turn 1, passage inline) -> simple"),
    "vicuna": Category(
        "simple", "easy", "Vicuna-bench generic, knowledge, roleplay, common-sense, counterfactual or writing -> simple"
    ),
    "qed/question": Category("simple", "easy", "a Natural Questions query from QED dev, alone -> simple (factoid)"),
    "bfcl/live-simple": Category("simple", "easy", "BFCL live_simple: one real user ask, one function -> simple"),
    "long/rag-system": Category(
        "simple", "long_context_easy", "QED question; its passage among others in a system prompt -> simple"
    ),
    "long/pasted-doc": Category(
        "simple", "long_context_easy", "QED question after its passage and others pasted in the user turn -> simple"
    ),
    "long/summarize": Category(
        "simple", "long_context_easy", "QED passages pasted in the user turn + a fixed summary ask -> simple"
    ),
    "long/history": Category(
        "simple", "long_context_easy", "a QED question after solved MATH/GSM8K/HumanEval turns -> simple"
    ),
    "long/bfcl-tools": Category(
        "simple",
        "long_context_easy",
        f"BFCL live_multiple: one real ask, {BFCL_TOOLS_CHARS[0]}-{BFCL_TOOLS_CHARS[1]} chars of functions -> simple",
    ),
    "long/tau-step": Category(
        "simple",
        "long_context_easy",
        "tau-bench airline (GPT-4o, reward 1): cut after a lookup result whose recorded next step relays it or "
        "looks up again -> simple",
    ),
}

COUNTS = {
    "math/level4-5": 112,
    "bbh/hard": 117,
    "mtbench/hard": 30,
    "arena-hard": 80,
    "hard-in-context/system": 20,
    "hard-in-context/history": 20,
    "gsm8k": 50,
    "humaneval": 40,
    "bbh/easy": 48,
    "mtbench/easy": 40,
    "mtbench/extraction": 10,
    "vicuna": 60,
    "qed/question": 50,
    "bfcl/live-simple": 30,
    "long/rag-system": 40,
    "long/pasted-doc": 40,
    "long/summarize": 25,
    "long/history": 40,
    "long/bfcl-tools": 40,
    "long/tau-step": 40,  # at most: the successful trajectories give one cut per task, 34 in all
}


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a source file: where it is, and what it says."""

    dataset: str
    file: str
    key: str
    """The record's own id, or its 0-based line or list index when it has none."""
    data: Any

    @property
    def rank(self) -> str:
        return hashlib.sha256(f"{self.dataset}:{self.key}".encode()).hexdigest()

    def source(self) -> dict[str, str]:
        return {"dataset": self.dataset, "file": self.file, "record": self.key}

    @property
    def ref(self) -> str:
        """``dataset:record``, for records an item uses as context (its history)."""
        return f"{self.dataset}:{self.key}"


def ranked(records: Iterable[Record]) -> list[Record]:
    """The sampling order: by hash of dataset and record id, so no one picks items by taste."""
    return sorted(records, key=lambda r: r.rank)


class Pool:
    """Records handed out in ranked order, each once across every pool that shares ``used``."""

    def __init__(self, records: Iterable[Record], used: set[tuple[str, str]]) -> None:
        self._records: Iterator[Record] = iter(ranked(records))
        self._used = used

    def take(self, n: int) -> list[Record]:
        taken: list[Record] = []
        for record in self._records:
            if len(taken) == n:
                break
            if (record.dataset, record.key) not in self._used:
                self._used.add((record.dataset, record.key))
                taken.append(record)
        if len(taken) < n:
            raise ValueError(f"pool ran out: wanted {n}, had {len(taken)}")
        return taken

    def one(self) -> Record:
        return self.take(1)[0]


class Padding:
    """Passages that are never asked about, handed out in ranked order and round again."""

    def __init__(self, records: Sequence[Record]) -> None:
        self._records = records
        self._next = 0

    def one(self) -> Record:
        record = self._records[self._next % len(self._records)]
        self._next += 1
        return record


# Reading the sources ----------------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def math_records(path: Path) -> list[Record]:
    return [Record("MATH", path.name, str(row["idx"]), row) for row in read_jsonl(path)]


def bbh_scores(metrics_dir: Path) -> dict[str, float]:
    """Task -> code-davinci-002 CoT accuracy, from the repo's ``<task>_few_shot_template_0-255000_eval_metrics``."""
    scores = {}
    for path in sorted(metrics_dir.glob("*_eval_metrics.jsonl")):
        task = path.name.split("_few_shot")[0]
        scores[task] = float(read_jsonl(path)[0]["accuracy"])
    return scores


def bbh_records(task_dir: Path, task: str) -> tuple[list[Record], str]:
    with open(task_dir / f"{task}.json", encoding="utf-8") as f:
        data = json.load(f)
    records = [Record("BBH", f"bbh/{task}.json", f"{task}/{i}", ex) for i, ex in enumerate(data["examples"])]
    return records, data["canary"]


def qed_records(path: Path) -> list[Record]:
    return [Record("QED", path.name, str(row["example_id"]), row) for row in read_jsonl(path)]


def tau_tools(tool_dir: Path) -> list[dict[str, Any]]:
    """The airline tools' JSON schemas: the literal dict each tool's ``get_info`` returns, read without running it."""
    tools = []
    for path in sorted(tool_dir.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "get_info":
                returned = next(n for n in ast.walk(node) if isinstance(n, ast.Return))
                tools.append(ast.literal_eval(returned.value))
    return sorted(tools, key=lambda t: t["function"]["name"])


# Building items ---------------------------------------------------------------------------------------------------


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


def item(category: str, record: Record, messages: list[Message], **extra: Any) -> dict[str, Any]:
    spec = CATEGORIES[category]
    return {
        "id": f"{category}:{record.dataset}:{record.key}",
        "label": spec.label,
        "category": category,
        "group": spec.group,
        "source": record.source(),
        "rule": spec.rule,
        "messages": messages,
        **extra,
    }


def openai_tools(functions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL's function docs as OpenAI tools (BFCL writes ``"type": "dict"`` where JSON Schema says ``object``)."""

    def schema(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: ("object" if k == "type" and v == "dict" else schema(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [schema(v) for v in value]
        return value

    return [{"type": "function", "function": schema(f)} for f in functions]


def documents(first: Record | None, padding: Padding, at_least: int, seed: str) -> tuple[str, list[str]]:
    """QED passages as numbered documents of ``at_least`` characters, ``first`` among them at a seeded place."""
    picked: list[Record] = []
    size = len(first.data["paragraph_text"]) if first else 0
    while size < at_least:
        record = padding.one()
        picked.append(record)
        size += len(record.data["paragraph_text"])
    if first is not None:
        place = int(hashlib.sha256(seed.encode()).hexdigest()[:8], 16) % (len(picked) + 1)
        picked.insert(place, first)
    text = "\n\n".join(
        f"Document {i} ({r.data['title_text']}):\n{r.data['paragraph_text']}" for i, r in enumerate(picked, 1)
    )
    return text, [r.key for r in picked if r is not first]


def qed_question(record: Record) -> str:
    return record.data["question_text"].strip() + "?"


def qed_answer(record: Record) -> str:
    return record.data["original_nq_answers"][0][0]["string"]


def gsm8k_answer(record: Record) -> str:
    return re.sub(r"<<[^>]*>>", "", record.data["answer"]).replace("####", "Answer:")


class Builder:
    """Turns the source files into items, category by category, keeping every pool's order."""

    def __init__(self, sources: Path) -> None:
        self.sources = sources
        self.items: list[dict[str, Any]] = []
        self.shared: dict[str, Any] = {}
        self.used: set[tuple[str, str]] = set()
        math = [r for r in math_records(self.path("math")) if r.data["level"] in ("Level 4", "Level 5")]
        types = sorted({r.data["type"] for r in math})
        self.math_by_type = {t: self.pool(r for r in math if r.data["type"] == t) for t in types}
        self.math_extra = self.pool(math)
        qed = ranked(qed_records(self.path("qed")))
        self.qed = self.pool(qed[:QED_ASKS])
        self.padding = Padding(qed[QED_ASKS:])
        gsm = read_jsonl(self.path("gsm8k"))
        self.gsm8k = self.pool(Record("GSM8K", SOURCE_FILES["gsm8k"], str(i), row) for i, row in enumerate(gsm))
        scores = bbh_scores(self.path("bbh_metrics"))
        self.bbh_hard: dict[str, Pool] = {}
        self.bbh_easy: dict[str, Pool] = {}
        self.bbh_canary = ""
        for task, score in sorted(scores.items()):
            if BBH_HARD_BELOW <= score < BBH_EASY_FROM:
                continue
            records, self.bbh_canary = bbh_records(self.path("bbh"), task)
            (self.bbh_hard if score < BBH_HARD_BELOW else self.bbh_easy)[task] = self.pool(records)
        humaneval = read_jsonl(self.path("humaneval"))
        name = SOURCE_FILES["humaneval"]
        self.humaneval = self.pool(Record("HumanEval", name, row["task_id"], row) for row in humaneval)
        mtbench = read_jsonl(self.path("mtbench"))
        self.mtbench = [Record("MT-bench", SOURCE_FILES["mtbench"], str(q["question_id"]), q) for q in mtbench]

    def pool(self, records: Iterable[Record]) -> Pool:
        return Pool(records, self.used)

    def path(self, name: str) -> Path:
        return self.sources / SOURCE_FILES[name]

    def add(self, items: Iterable[dict[str, Any]]) -> None:
        self.items.extend(items)

    def build(self) -> list[dict[str, Any]]:
        self.add(self.math())
        self.add(self.bbh(self.bbh_hard, "bbh/hard"))
        self.add(self.bbh(self.bbh_easy, "bbh/easy"))
        self.add(self.mtbench_items())
        self.add(self.vicuna())
        self.add(self.arena())
        self.add(self.gsm8k_items())
        self.add(self.humaneval_items())
        self.add(self.qed_questions())
        self.add(self.bfcl())
        self.add(self.tau())
        # Constructed long-context items last: they draw on what the plain categories left in each pool.
        self.add(self.rag(in_system=True))
        self.add(self.rag(in_system=False))
        self.add(self.summaries())
        self.add(self.easy_after_history())
        self.add(self.hard_in_context())
        return self.items

    def math(self) -> Iterator[dict[str, Any]]:
        per_type = COUNTS["math/level4-5"] // len(self.math_by_type)
        for pool in self.math_by_type.values():
            for record in pool.take(per_type):
                yield item("math/level4-5", record, [user(record.data["problem"])])

    def bbh(self, pools: dict[str, Pool], category: str) -> Iterator[dict[str, Any]]:
        per_task = COUNTS[category] // len(pools)
        for pool in pools.values():
            for record in pool.take(per_task):
                yield self.bbh_item(category, record)

    def bbh_item(self, category: str, record: Record, messages: list[Message] | None = None) -> dict[str, Any]:
        built = item(category, record, messages or [user(record.data["input"])])
        built["source"]["canary"] = self.bbh_canary
        return built

    def mtbench_items(self) -> Iterator[dict[str, Any]]:
        categories = {
            "reasoning": "mtbench/hard",
            "math": "mtbench/hard",
            "coding": "mtbench/hard",
            "writing": "mtbench/easy",
            "roleplay": "mtbench/easy",
            "humanities": "mtbench/easy",
            "stem": "mtbench/easy",
            "extraction": "mtbench/extraction",
        }
        for record in ranked(self.mtbench):
            category = categories[record.data["category"]]
            yield item(category, record, [user(record.data["turns"][0])], source_category=record.data["category"])

    def vicuna(self) -> Iterator[dict[str, Any]]:
        kept = {"generic", "knowledge", "roleplay", "common-sense", "counterfactual", "writing"}
        rows = read_jsonl(self.path("vicuna"))
        records = [Record("Vicuna-bench", SOURCE_FILES["vicuna"], str(q["question_id"]), q) for q in rows]
        for record in ranked(r for r in records if r.data["category"] in kept)[: COUNTS["vicuna"]]:
            yield item("vicuna", record, [user(record.data["turns"][0])], source_category=record.data["category"])

    def arena(self) -> Iterator[dict[str, Any]]:
        rows = read_jsonl(self.path("arena"))
        records = [Record("Arena-Hard", SOURCE_FILES["arena"], q["uid"], q) for q in rows]
        short = self.pool(r for r in records if len(r.data["prompt"]) <= ARENA_MAX_CHARS)
        for record in short.take(COUNTS["arena-hard"]):
            yield item("arena-hard", record, [user(record.data["prompt"])], source_category=record.data["cluster"])

    def gsm8k_items(self) -> Iterator[dict[str, Any]]:
        for record in self.gsm8k.take(COUNTS["gsm8k"]):
            yield item("gsm8k", record, [user(record.data["question"])])

    def humaneval_items(self) -> Iterator[dict[str, Any]]:
        for record in self.humaneval.take(COUNTS["humaneval"]):
            yield item("humaneval", record, [user(HUMANEVAL_ASK.format(prompt=record.data["prompt"]))])

    def qed_questions(self) -> Iterator[dict[str, Any]]:
        for record in self.qed.take(COUNTS["qed/question"]):
            yield item("qed/question", record, [user(qed_question(record))])

    def bfcl(self) -> Iterator[dict[str, Any]]:
        def records(name: str) -> list[Record]:
            rows = read_jsonl(self.path(name))
            return [Record("BFCL", SOURCE_FILES[name], row["id"], row) for row in rows]

        def bfcl_item(category: str, record: Record) -> dict[str, Any]:
            return item(category, record, record.data["question"][0], tools=openai_tools(record.data["function"]))

        simple = self.pool(records("bfcl_live_simple"))
        for record in simple.take(COUNTS["bfcl/live-simple"]):
            yield bfcl_item("bfcl/live-simple", record)
        low, high = BFCL_TOOLS_CHARS
        sized = [r for r in records("bfcl_live_multiple") if low <= len(json.dumps(r.data["function"])) <= high]
        multiple = self.pool(sized)
        for record in multiple.take(COUNTS["long/bfcl-tools"]):
            yield bfcl_item("long/bfcl-tools", record)

    def tau(self) -> Iterator[dict[str, Any]]:
        """One cut per task, in its first successful trial: the first lookup result followed by a relay or lookup."""
        with open(self.path("tau_trajectories"), encoding="utf-8") as f:
            runs = json.load(f)
        policy, tools = TAU_SHARED
        seen: set[int] = set()
        cuts = []
        for index, run in enumerate(runs):
            if run["reward"] != 1 or run["task_id"] in seen:
                continue
            cut = tau_cut(run["traj"])
            if cut is None:
                continue
            seen.add(run["task_id"])
            key = f"{index}:task{run['task_id']}/trial{run['trial']}@{cut}"
            cuts.append(Record("tau-bench", SOURCE_FILES["tau_trajectories"], key, run["traj"][:cut]))
        systems = {record.data[0]["content"] for record in cuts}
        if len(systems) != 1:
            raise ValueError("expected one airline policy shared by every trajectory")
        self.shared[policy] = systems.pop()
        self.shared[tools] = tau_tools(self.path("tau_tools"))
        for record in ranked(cuts)[: COUNTS["long/tau-step"]]:
            messages = [{"role": "system", "content_ref": policy}, *record.data[1:]]
            yield item("long/tau-step", record, messages, tools_ref=tools)

    def rag(self, in_system: bool) -> Iterator[dict[str, Any]]:
        category = "long/rag-system" if in_system else "long/pasted-doc"
        for record in self.qed.take(COUNTS[category]):
            docs, padding = documents(record, self.padding, LONG_CONTEXT_CHARS, record.key)
            if in_system:
                messages = [{"role": "system", "content": RAG_SYSTEM + docs}, user(qed_question(record))]
            else:
                messages = [user(f"{docs}\n\nQuestion: {qed_question(record)}")]
            yield item(category, record, messages, padding=padding)

    def summaries(self) -> Iterator[dict[str, Any]]:
        for n in range(COUNTS["long/summarize"]):
            first = self.qed.one()
            docs, padding = documents(first, self.padding, LONG_CONTEXT_CHARS, first.key)
            ask = SUMMARY_ASKS[n % len(SUMMARY_ASKS)]
            yield item("long/summarize", first, [user(f"{docs}\n\n{ask}")], padding=padding)

    def solved_turns(self, at_least: int) -> tuple[list[Message], list[str]]:
        """Questions (MATH level 4-5, GSM8K, HumanEval in turn) with their reference solutions, as earlier turns of
        a chat, until they make ``at_least`` characters."""
        messages: list[Message] = []
        used = []
        i = 0
        while sum(len(m["content"]) for m in messages) < at_least:
            kind = i % 3
            i += 1
            if kind == 0:
                record = self.math_extra.one()
                pair = (record.data["problem"], record.data["solution"])
            elif kind == 1:
                record = self.gsm8k.one()
                pair = (record.data["question"], gsm8k_answer(record))
            else:
                record = self.humaneval.one()
                prompt = HUMANEVAL_ASK.format(prompt=record.data["prompt"])
                pair = (prompt, f"```python\n{record.data['prompt']}{record.data['canonical_solution']}```")
            messages += [user(pair[0]), assistant(pair[1])]
            used.append(record.ref)
        return messages, used

    def easy_turns(self, at_least: int) -> tuple[list[Message], list[str]]:
        """Factoid questions with their Natural Questions answers and GSM8K problems with their solutions, in
        turn, as earlier turns of a chat, until they make ``at_least`` characters."""
        messages: list[Message] = []
        used = []
        while sum(len(m["content"]) for m in messages) < at_least:
            qed, gsm8k = self.padding.one(), self.gsm8k.one()
            messages += [user(qed_question(qed)), assistant(qed_answer(qed))]
            messages += [user(gsm8k.data["question"]), assistant(gsm8k_answer(gsm8k))]
            used += [qed.ref, gsm8k.ref]
        return messages, used

    def easy_after_history(self) -> Iterator[dict[str, Any]]:
        for _ in range(COUNTS["long/history"]):
            history, used = self.solved_turns(LONG_CONTEXT_CHARS)
            record = self.qed.one()
            yield item("long/history", record, [*history, user(qed_question(record))], history=used)

    def hard_in_context(self) -> Iterator[dict[str, Any]]:
        hard_bbh = list(self.bbh_hard.values())
        for n in range(COUNTS["hard-in-context/system"] + COUNTS["hard-in-context/history"]):
            in_system = n < COUNTS["hard-in-context/system"]
            category = "hard-in-context/system" if in_system else "hard-in-context/history"
            if n % 2 == 0:
                record = self.math_extra.one()
                ask = record.data["problem"]
            else:
                record = hard_bbh[n % len(hard_bbh)].one()
                ask = record.data["input"]
            if in_system:
                docs, padding = documents(None, self.padding, LONG_CONTEXT_CHARS, record.key)
                messages = [{"role": "system", "content": RAG_SYSTEM + docs}, user(ask)]
                extra: dict[str, Any] = {"padding": padding}
            else:
                history, used = self.easy_turns(LONG_CONTEXT_CHARS)
                messages = [*history, user(ask)]
                extra = {"history": used}
            built = item(category, record, messages, **extra)
            if record.dataset == "BBH":
                built["source"]["canary"] = self.bbh_canary
            yield built


def tau_cut(trajectory: Sequence[Message]) -> int | None:
    """Where to cut: after the first lookup result whose next assistant turn is a reply or another lookup."""
    for i in range(1, len(trajectory) - 1):
        message, following = trajectory[i], trajectory[i + 1]
        if message.get("role") != "tool" or message.get("name") not in TAU_LOOKUPS:
            continue
        if following.get("role") != "assistant":
            continue
        calls = following.get("tool_calls") or []
        if all(call["function"]["name"] in TAU_LOOKUPS for call in calls):
            return i + 1
    return None


# Writing ----------------------------------------------------------------------------------------------------------


def write(items: Sequence[dict[str, Any]], shared: dict[str, Any], out: Path) -> None:
    ids = [i["id"] for i in items]
    duplicates = [i for i, n in Counter(ids).items() if n > 1]
    if duplicates:
        raise ValueError(f"duplicate ids: {duplicates[:5]}")
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        rows = sorted((i for i in items if split_of(i["id"]) == split), key=lambda i: i["id"])
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows)
    with open(out / "shared.json", "w", encoding="utf-8") as f:
        json.dump(shared, f, ensure_ascii=False, indent=1)
        f.write("\n")


def print_counts(items: Sequence[dict[str, Any]]) -> None:
    """The per-category table SOURCES.md shows."""
    counts: Counter[tuple[str, str]] = Counter((i["category"], split_of(i["id"])) for i in items)
    print("| category | label | group | train | test | rule |\n| --- | --- | --- | --- | --- | --- |")
    for name, spec in CATEGORIES.items():
        train, test = counts[(name, "train")], counts[(name, "test")]
        print(f"| {name} | {spec.label} | {spec.group} | {train} | {test} | {spec.rule} |")
    total = Counter(split_of(i["id"]) for i in items)
    print(f"| all | | | {total['train']} | {total['test']} | |")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", type=Path, required=True, help="folder holding the files in SOURCE_FILES")
    parser.add_argument("--out", type=Path, default=EVAL_DIR)
    args = parser.parse_args(argv)
    builder = Builder(args.sources)
    items = builder.build()
    write(items, builder.shared, args.out)
    print_counts(items)


if __name__ == "__main__":
    main()

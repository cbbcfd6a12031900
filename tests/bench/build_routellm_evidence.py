"""Rebuilds the routing evidence (what a weak model got wrong and a strong one got right) from RouteLLM's eval files.

    python -m tests.bench.build_routellm_evidence --git-dir DIR [--out policies/complexity_eval/routellm.jsonl.gz]

``DIR`` is a git directory of lm-sys/RouteLLM (Apache-2.0); files are read from its ``HEAD`` with ``git show``. Per
item it keeps only the prompt and each model's outcome: MMLU and GSM8K correctness (1/0) of Mixtral-8x7B-Instruct
(weak) and GPT-4-1106-preview (strong), MT-bench's GPT-4 judge score (1-10) of each, averaged over the two turns
(routing reads turn one, as RouteLLM's benchmark does). Prompts RouteLLM lists in a ``contaminated_prompts.jsonl``
(near-duplicates of its router training data) are left out, as its own evaluation leaves them out. Item ids are
``<set>/<sha256 of the prompt, 12 hex>``; the train/test split is by a hash of the id (``split_of``).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.bench.complexity_eval import EVAL_DIR

WEAK = "mistralai/Mixtral-8x7B-Instruct-v0.1"
STRONG = "gpt-4-1106-preview"
OUT = EVAL_DIR / "routellm.jsonl.gz"


def _show(git_dir: Path, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(git_dir), "show", f"HEAD:{path}"], check=True, capture_output=True, text=True
    ).stdout


def _list(git_dir: Path, prefix: str) -> list[str]:
    out = subprocess.run(
        ["git", "--git-dir", str(git_dir), "ls-tree", "-r", "--name-only", "HEAD", prefix],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted(line for line in out.splitlines() if line.endswith(".csv"))


def _contaminated(git_dir: Path, bench: str) -> set[str]:
    text = _show(git_dir, f"routellm/evals/{bench}/contaminated_prompts.jsonl")
    return {json.loads(line)["eval_prompt"] for line in text.splitlines() if line.strip()}


def _item(dataset: str, prompt: str, weak: float, strong: float, **extra: Any) -> dict[str, Any]:
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return {"id": f"{dataset}/{digest}", "set": dataset, **extra, "prompt": prompt, "weak": weak, "strong": strong}


def _truth(value: str) -> int:
    return 1 if value.strip() == "True" else 0


def mmlu(git_dir: Path) -> tuple[list[dict[str, Any]], int]:
    dropped = _contaminated(git_dir, "mmlu")
    items, skipped = [], 0
    for path in _list(git_dir, "routellm/evals/mmlu/responses/"):
        subject = Path(path).stem.removeprefix("mmlu_")
        for row in csv.DictReader(io.StringIO(_show(git_dir, path))):
            if row["prompt"] in dropped:
                skipped += 1
                continue
            items.append(_item("mmlu", row["prompt"], _truth(row[WEAK]), _truth(row[STRONG]), subject=subject))
    return items, skipped


def gsm8k(git_dir: Path) -> tuple[list[dict[str, Any]], int]:
    dropped = _contaminated(git_dir, "gsm8k")
    items, skipped = [], 0
    for row in csv.DictReader(io.StringIO(_show(git_dir, "routellm/evals/gsm8k/gsm8k_responses.csv"))):
        if row["prompt"] in dropped:
            skipped += 1
            continue
        items.append(_item("gsm8k", row["prompt"], _truth(row[WEAK]), _truth(row[STRONG])))
    return items, skipped


def mt_bench(git_dir: Path) -> tuple[list[dict[str, Any]], int]:
    dropped = _contaminated(git_dir, "mt_bench")
    scores: dict[tuple[int, str], list[float]] = defaultdict(list)
    for line in _show(git_dir, "routellm/evals/mt_bench/judgements.jsonl").splitlines():
        if line.strip():
            record = json.loads(line)
            scores[(record["question_id"], record["model"])].append(float(record["score"]))
    items, skipped = [], 0
    for line in _show(git_dir, "routellm/evals/mt_bench/question.jsonl").splitlines():
        if not line.strip():
            continue
        question = json.loads(line)
        turns = question["turns"]
        if any(turn in dropped for turn in turns):
            skipped += 1
            continue
        weak = scores[(question["question_id"], WEAK)]
        strong = scores[(question["question_id"], STRONG)]
        if not weak or not strong:
            continue
        items.append(
            _item(
                "mt_bench",
                turns[0],
                round(sum(weak) / len(weak), 3),
                round(sum(strong) / len(strong), 3),
                category=question["category"],
            )
        )
    return items, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--git-dir", type=Path, required=True, help="a git directory of lm-sys/RouteLLM")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name, build in (("mmlu", mmlu), ("gsm8k", gsm8k), ("mt_bench", mt_bench)):
        items, skipped = build(args.git_dir)
        print(f"{name}: {len(items)} items kept, {skipped} contaminated prompts left out")
        rows.extend(items)
    seen: set[str] = set()
    unique = [r for r in rows if not (r["id"] in seen or seen.add(r["id"]))]
    if len(unique) != len(rows):
        print(f"{len(rows) - len(unique)} duplicate prompts kept once")
    payload = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in unique)
    with gzip.GzipFile(args.out, "wb", mtime=0, compresslevel=9) as f:
        f.write(payload.encode())
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()

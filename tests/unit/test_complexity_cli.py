"""``spillgate complexity train``, ``eval`` and ``threshold`` round-trip on a small evidence file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spillgate.gateway.cli import main
from spillgate.policies.complexity_data import read_evidence, split_of
from spillgate.policies.complexity_modelfile import load_model
from spillgate.policies.complexity_ngram import NgramClassifier

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "complexity" / "evidence_small.jsonl"


def apgr_of(output: str, router: str) -> float:
    match = re.search(rf"^\| {re.escape(router)} \| ([0-9.]+) \|", output, re.MULTILINE)
    assert match, output
    return float(match.group(1))


def test_train_writes_a_model_that_eval_judges_on_the_held_out_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model.json"
    assert main(["complexity", "train", "--data", str(FIXTURE), "--out", str(out), "--l1", "0.1"]) == 0
    trained = capsys.readouterr().out
    assert "wrote" in trained and apgr_of(trained, "model") > 0.7  # random: 0.5; a perfect order: 0.76 here

    model = load_model(out)
    held_out = [r for r in read_evidence(FIXTURE) if split_of(r.id) == "test"]
    assert model.meta["held_out_items"] == len(held_out) > 0
    assert model.meta["trained_on"] == [FIXTURE.name]
    classifier = NgramClassifier(model)
    hard = [classifier.score(r.payload).score for r in held_out if r.label]
    easy = [classifier.score(r.payload).score for r in held_out if not r.label]
    assert min(hard) > max(easy)

    assert main(["complexity", "eval", "--model", str(out), "--data", str(FIXTURE)]) == 0
    report = capsys.readouterr().out
    assert f"fixture: {len(held_out)} asks (test split" in report
    assert apgr_of(report, str(out)) == pytest.approx(apgr_of(trained, "model"))
    assert apgr_of(report, "random (expected)") == 0.5
    assert "PGR at strong-call share: 0% 0.00" in report

    assert main(["complexity", "threshold", "--model", str(out), "--share", "0.5"]) == 0
    threshold = float(capsys.readouterr().out)
    assert threshold == pytest.approx(model.threshold_for_share(0.5), abs=1e-4)
    assert 0 < threshold < 1


def test_bad_inputs_are_refused_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "label": true}\n{"prompt": "no evidence"}\n')
    assert main(["complexity", "train", "--data", str(bad), "--out", str(tmp_path / "m.json")]) == 2
    assert "line 2: needs 'label'" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()

    broken = tmp_path / "broken.json"
    broken.write_text("[]")
    assert main(["complexity", "eval", "--model", str(broken), "--data", str(FIXTURE)]) == 2
    assert "not a complexity model file" in capsys.readouterr().err
    assert main(["complexity", "threshold", "--model", str(broken), "--share", "0.2"]) == 2
    assert main(["complexity", "threshold", "--share", "2"]) == 2


def test_an_unwritable_output_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "missing" / "model.json"
    assert main(["complexity", "train", "--data", str(FIXTURE), "--out", str(out)]) == 2
    assert "cannot write" in capsys.readouterr().err

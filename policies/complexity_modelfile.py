"""Complexity model files: JSON a team trains (``spillgate complexity train``) and a route's config points at.

A file is read whole and checked before it is used (at start and on every live config edit), so a bad file is a
config error naming the field, never a failure on a request. ``routellm`` names the model shipped in this package,
trained on RouteLLM's public evidence (policies/complexity_models/routellm.json).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spillgate.policies.complexity import FEATURE_NAMES
from spillgate.policies.complexity_ngram import NgramClassifier, NgramModel

FORMAT = "spillgate-complexity-model"
VERSION = 1
SHIPPED = {"routellm": Path(__file__).resolve().parent / "complexity_models" / "routellm.json"}
"""Names of the models shipped in the package, and their files."""
MAX_BYTES = 64 * 1024 * 1024


class ModelFileError(ValueError):
    """A model file that cannot be used: the message says which file and what is wrong."""


def resolve(reference: str) -> Path:
    """The file a config's ``complexity_model`` names: a shipped model's name, or a path."""
    shipped = SHIPPED.get(reference)
    return shipped if shipped is not None else Path(os.path.expanduser(reference))


def load_model(reference: str | Path) -> NgramModel:
    """Read and check a model file (or a shipped model's name); raise ``ModelFileError`` when it cannot be used."""
    path = resolve(str(reference))
    try:
        stat = path.stat()
    except OSError as error:
        raise ModelFileError(f"{path}: cannot read: {error.strerror}") from None
    return _load_checked(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _load_checked(path: str, mtime_ns: int, size: int) -> NgramModel:
    """Cached by path, modification time and size: a live edit re-reads a file that changed, and only that one."""
    if size > MAX_BYTES:
        raise ModelFileError(f"{path}: {size:,} bytes, more than a model file may have ({MAX_BYTES:,})")
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except OSError as error:
        raise ModelFileError(f"{path}: cannot read: {error.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelFileError(f"{path}: not a JSON model file ({error})") from None
    try:
        return model_from_document(document)
    except ModelFileError as error:
        raise ModelFileError(f"{path}: {error}") from None


def classifier_for(reference: str | Path) -> NgramClassifier:
    return NgramClassifier(load_model(reference))


def model_from_document(document: Any) -> NgramModel:
    """The model a parsed JSON document describes, every field checked."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ModelFileError(f"not a complexity model file ('format' must be {FORMAT!r})")
    if document.get("version") != VERSION:
        raise ModelFileError(f"unsupported version {document.get('version')!r} (this gateway reads {VERSION})")
    bias = _number(document.get("bias"), "bias")
    cues = document.get("cue_weights", {})
    if not isinstance(cues, dict):
        raise ModelFileError("'cue_weights' must be an object")
    unknown = sorted(set(cues) - set(FEATURE_NAMES))
    if unknown:
        raise ModelFileError(f"'cue_weights' names unknown cues {unknown}; known: {list(FEATURE_NAMES)}")
    cue_weights = tuple(_number(cues.get(name, 0.0), f"cue_weights.{name}") for name in FEATURE_NAMES)
    grams = document.get("ngram_weights")
    if not isinstance(grams, dict):
        raise ModelFileError("'ngram_weights' must be an object of n-gram to weight")
    ngram_weights = {str(g): _number(w, f"ngram_weights.{g!r}") for g, w in grams.items()}
    calibration = document.get("calibration")
    if not isinstance(calibration, list) or len(calibration) < 2:
        raise ModelFileError("'calibration' must list the score at each percentile of the training asks (0..100)")
    points = tuple(_number(v, "calibration") for v in calibration)
    if any(not 0.0 <= v <= 1.0 for v in points) or any(b < a for a, b in itertools.pairwise(points)):
        raise ModelFileError("'calibration' must rise from 0 to 1 (scores at increasing percentiles)")
    meta = document.get("meta", {})
    if not isinstance(meta, dict):
        raise ModelFileError("'meta' must be an object")
    return NgramModel(bias, cue_weights, ngram_weights, points, meta)


def document_of(model: NgramModel) -> dict[str, Any]:
    """The JSON document that ``model_from_document`` reads back as ``model``."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "kind": "ngram-logistic",
        "meta": dict(model.meta),
        "bias": model.bias,
        "cue_weights": dict(zip(FEATURE_NAMES, model.cue_weights, strict=True)),
        "calibration": list(model.calibration),
        "ngram_weights": dict(sorted(model.ngram_weights.items())),
    }


def save_model(model: NgramModel, path: str | Path) -> None:
    """Write ``model`` as a model file (atomically: a gateway never reads half of one)."""
    target = Path(path)
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_text(json.dumps(document_of(model), separators=(",", ":"), ensure_ascii=False) + "\n")
    temporary.replace(target)


def threshold_from(reference: str | Path, share: float) -> float:
    """The score threshold under which about ``share`` of asks like the model's training asks are complex."""
    return load_model(reference).threshold_for_share(share)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ModelFileError(f"'{where}' must be a finite number, not {value!r}")
    return float(value)


def describe(model: NgramModel) -> Mapping[str, Any]:
    """What a model says about itself, for logs and the CLI."""
    return {"ngrams": len(model.ngram_weights), **model.meta}


def route_complexity(
    model: str | None, threshold: float | None, share: float | None
) -> tuple[NgramClassifier | None, float | None]:
    """A route's classifier (``None``: the gateway's built-in one) and score threshold, from its spill settings.

    ``share`` (a target share of asks called complex) becomes the threshold the model's calibration gives for it.
    """
    if model is None:
        return None, threshold
    loaded = load_model(model)
    if share is not None:
        threshold = loaded.threshold_for_share(share)
    return NgramClassifier(loaded), threshold

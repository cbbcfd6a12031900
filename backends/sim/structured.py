"""JSON the simulated model "writes" when a grammar constrains it: tool-call arguments and ``response_format``.

The real engines compile the schema into a grammar and let the model fill it in; the simulator picks the values
itself, from a seeded generator, so equal requests get equal JSON. Simple schemas are honoured (objects with
properties and ``required``, strings, numbers, integers, booleans, ``enum``, ``const``, arrays, null, ``anyOf``);
anything else gets a plausible value of the declared type.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import orjson

from spillgate.backends.sim.tokenizer import OUTPUT_WORDS

_MAX_DEPTH = 4


def sample(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value that satisfies ``schema`` (for the keywords listed in the module docstring)."""
    if not isinstance(schema, Mapping):
        return _words(rng)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for keyword in ("anyOf", "oneOf"):
        options = schema.get(keyword)
        if isinstance(options, list) and options:
            return sample(options[0], rng, depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        return _object(schema, rng, depth)
    if kind == "array":
        return _array(schema, rng, depth)
    if kind == "integer":
        low = int(schema.get("minimum", 0))
        return rng.randint(low, max(low, int(schema.get("maximum", low + 100))))
    if kind == "number":
        low = float(schema.get("minimum", 0.0))
        return round(rng.uniform(low, max(low, float(schema.get("maximum", low + 100.0)))), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _words(rng, int(schema.get("maxLength", 0)) or None)


def _object(schema: Mapping[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or depth >= _MAX_DEPTH:
        return {} if properties is not None or depth >= _MAX_DEPTH else {"answer": _words(rng)}
    return {str(name): sample(sub, rng, depth + 1) for name, sub in properties.items()}


def _array(schema: Mapping[str, Any], rng: random.Random, depth: int) -> list[Any]:
    low = int(schema.get("minItems", 1))
    high = max(low, int(schema.get("maxItems", low + 2)))
    if depth >= _MAX_DEPTH:
        return []
    return [sample(schema.get("items", {}), rng, depth + 1) for _ in range(rng.randint(low, high))]


def _words(rng: random.Random, max_length: int | None = None) -> str:
    text = " ".join(rng.choice(OUTPUT_WORDS) for _ in range(rng.randint(1, 3)))
    return text[:max_length] if max_length else text


def dumps(value: Any) -> str:
    """JSON as the engines' constrained output looks: compact separators with a space, like ``json.dumps``."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{dumps(str(k))}: {dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    return orjson.dumps(value).decode()


def response_format_text(response_format: Mapping[str, Any], rng: random.Random) -> str | None:
    """The reply for ``response_format`` ``json_object`` / ``json_schema``; None for ``text`` (free text)."""
    kind = response_format.get("type")
    if kind == "json_object":
        return dumps({"answer": _words(rng)})
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema", spec.get("schema_")) if isinstance(spec, Mapping) else None
        return dumps(sample(schema if schema is not None else {"type": "object"}, rng))
    return None

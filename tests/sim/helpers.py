"""Prompt builders and /metrics parsing for the simulator tests."""

from __future__ import annotations

import random

import httpx
from prometheus_client.parser import text_string_to_metric_families

_WORDS = ("alpha", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "mike", "oscar", "papa")


def distinct_ids(count: int, seed: int) -> list[int]:
    """``count`` token ids no other seed shares a prefix with (first id differs almost surely)."""
    rng = random.Random(seed)
    return [rng.randrange(1, 120000) for _ in range(count)]


def words(count: int, seed: int) -> str:
    """About ``count`` tokens of text: short words encode to one token each."""
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def metric_samples(base_url: str) -> dict[str, float]:
    """Every sample of /metrics, keyed by sample name (labels dropped, values of one name summed)."""
    text = httpx.get(base_url + "/metrics", timeout=10.0).text
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def generate(client: httpx.Client, input_ids: list[int], max_new_tokens: int = 4, **extra: object) -> dict:
    response = client.post(
        "/generate", json={"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens}, **extra}
    )
    response.raise_for_status()
    return response.json()

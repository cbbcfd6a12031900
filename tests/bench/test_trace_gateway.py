"""``tests.bench.trace_gateway``: the decision trace that tail and prediction studies read keeps working as the
proxy changes.

Its hooks wrap gateway internals by name, so a refactor of the hot path can silently break them; this runs the
traced gateway over one simulated replica and reads back the line one request leaves.
"""

from __future__ import annotations

from pathlib import Path

import openai
import orjson

from tests.bench.compare_cluster import API_KEY, ROUTE, Cluster, start_spillgate
from tests.bench.prediction_accuracy import predicted_and_real


def test_a_traced_gateway_writes_what_the_policy_saw_and_what_happened(tmp_path: Path) -> None:
    cluster = Cluster(time_scale=1.0, log_dir=tmp_path)
    trace = tmp_path / "trace.jsonl"
    try:
        cluster.start(1)
        relay = start_spillgate(cluster, "cache_aware", trace=trace)
        try:
            client = openai.OpenAI(base_url=relay.url + "/v1", api_key=API_KEY, max_retries=0)
            reply = client.chat.completions.create(
                model=ROUTE, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
            )
            assert reply.usage is not None and reply.usage.completion_tokens == 4
        finally:
            relay.service.stop()
    finally:
        cluster.stop()
    (line,) = trace.read_bytes().splitlines()
    entry = orjson.loads(line)
    assert entry["chosen"] == entry["backend"] and [b["name"] for b in entry["backends"]] == [entry["backend"]]
    assert entry["outcome"] == "ok"
    assert entry["sent_at"] <= entry["first_token_at"] <= entry["ended"]
    assert entry["usage_prompt_tokens"] == reply.usage.prompt_tokens
    # What tests.bench.prediction_accuracy reads from it: the chosen replica's prediction, and the real TTFT.
    ((predicted, real),) = predicted_and_real([entry])
    assert predicted == entry["backends"][0]["predicted_ttft_s"] > 0
    assert real == entry["first_token_at"] - entry["decided_at"] > 0
    assert predicted_and_real([{**entry, "first_token_at": 0.0}]) == [], "a request that never saw a first token"

"""Figures read off an engine's exposition page: a family nothing has observed yet is absent, not a zero."""

from __future__ import annotations

from spillgate.backends.engines.prometheus import read_figures

PAGE = """# HELP sglang:num_queue_reqs Waiting requests.
# TYPE sglang:num_queue_reqs gauge
# HELP sglang:num_running_reqs Running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0"} 3.0
sglang:num_running_reqs{dp_rank="1"} 4.0
# HELP vllm:prompt_tokens_total Prompt tokens.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0"} 12.0
"""


def test_a_family_with_no_samples_is_not_read_as_zero() -> None:
    figures = read_figures(
        PAGE,
        summed={"sglang:num_queue_reqs": "waiting", "sglang:num_running_reqs": "running"},
        counters={"vllm:prompt_tokens_total": "prompt"},
    )
    assert figures == {"running": 7.0, "prompt": 12.0}

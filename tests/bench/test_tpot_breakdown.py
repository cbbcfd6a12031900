"""The TPOT breakdown's own arithmetic: per-replica figures, the client's TPOTs by replica, the fit."""

from __future__ import annotations

import pytest

from spillgate.gateway.bench.api import LevelResult
from spillgate.gateway.bench.client import RequestResult
from spillgate.gateway.bench.stats import Slo, summarize
from tests.bench.compare_routers import Run
from tests.bench.tpot_breakdown import check_rows, fit, run_figures
from tests.support.gateway import replica_name


def _delta(decode_tokens: float, stalled: float, tpot_sum: float, requests: float) -> dict[str, float]:
    return {
        "now": 5.0, "prefill_passes": 10.0, "prefill_s": 2.0, "prefill_tokens": 20000.0, "stalled_decoder_s": stalled,
        "late_decoder_s": 0.0, "decode_passes": 100.0, "decode_s": 0.8, "decode_tokens": decode_tokens,
        "decode_token_s": 0.008 * decode_tokens, "decode_context_tokens": 1e6, "arrivals": requests,
        "decoders_at_arrival": 4 * requests, "waiting_at_arrival": requests,
        "sglang:num_requests_total": requests, "sglang:prompt_tokens_total": 24000.0,
        "sglang:cached_tokens_total": 4000.0, "sglang:request_time_per_output_token_seconds_sum": tpot_sum,
        "sglang:request_time_per_output_token_seconds_count": requests,
    }  # fmt: skip


def test_figures_split_the_inter_token_latency_and_file_client_tpots_under_their_replica() -> None:
    slo = Slo(ttft_ms=1000.0, tpot_ms=50.0)
    urls = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    first_name, second_name = (replica_name(url, "sims") for url in urls)
    results = [
        RequestResult(start=0.0, ok=True, backend=first_name, tpot=0.06),
        RequestResult(start=0.1, ok=True, backend=second_name, tpot=0.12),
        RequestResult(start=0.2, ok=False, backend=second_name, tpot=None),
        RequestResult(start=0.3, ok=True, backend="-", tpot=0.09),  # a router that does not say
    ]
    summary = summarize(results, duration_s=1.0, unfinished=0, slo=slo)
    run = Run(LevelResult("r", None, 1.0, summary, results), [], 1.0, (1.0, 0.0), slo)
    figures = run_figures(run, [_delta(1000, 12.0, 0.2, 10), _delta(500, 2.0, 0.1, 5)], time_scale=6.0, urls=urls)

    first, second, cluster = (fig.to_json() for fig in figures)
    assert first["itl_decode_ms"] == pytest.approx(8.0) and first["itl_prefill_stall_ms"] == pytest.approx(12.0)
    assert first["mean_decode_batch"] == 10.0 and first["decoders_per_prefill_s"] == 6.0
    assert first["replica_tpot_mean_ms"] == pytest.approx(20.0) and first["hit"] == pytest.approx(1 / 6)
    assert first["decoders_at_arrival"] == 4.0 and first["queued_at_arrival"] == 1.0
    assert figures[0].client_tpots_ms == pytest.approx([10.0]) and figures[1].client_tpots_ms == pytest.approx([20.0])
    assert cluster["client_requests"] == 3 and cluster["client_tpot_mean_ms"] == pytest.approx(15.0)
    assert cluster["itl_prefill_stall_ms"] == pytest.approx(1000 * 14.0 / 1500)
    assert cluster["requests"] == 15 and second["replica_tpot_mean_ms"] == pytest.approx(20.0)


def test_the_fit_finds_one_slope_and_each_rows_offset_at_equal_prefill_work() -> None:
    points = {
        "sglang-router": [(400.0, 20.0), (420.0, 24.0), (440.0, 28.0)],
        "events": [(410.0, 23.0), (450.0, 31.0)],  # the same line, 1 ms higher
    }
    found = fit(points)
    assert found is not None
    assert found.slope_ms_per_ktok == pytest.approx(0.2)
    assert found.offset("events", "sglang-router") == pytest.approx(1.0)
    assert found.residual_sd_ms == pytest.approx(0.0, abs=1e-9)
    assert fit({"events": [(400.0, 20.0)]}) is None  # one run says nothing of a slope


def test_rows_are_checked() -> None:
    check_rows(["events", "belief", "nohold", "sticky", "sglang-router", "spillgate-least_load"])
    with pytest.raises(ValueError, match="unknown rows"):
        check_rows(["smg"])

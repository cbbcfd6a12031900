"""Live capacity advice: the bucketed demand, the arithmetic, and the scaling rule, on invented times."""

from __future__ import annotations

import pytest

from spillgate.backends.backend import Backend
from spillgate.backends.engines import ReplicaLoad
from spillgate.gateway.capacity.advice import PoolAdvice, advise, peak_rate
from spillgate.gateway.capacity.recorder import CapacityRecorder
from spillgate.gateway.capacity.series import BucketSeries
from spillgate.gateway.cli import main
from spillgate.gateway.control.config import ConfigError, GatewayConfig, parse_config
from spillgate.gateway.plan.estimate import fleet
from spillgate.gateway.plan.inputs import GPUS, OperatingPoint, Traffic
from spillgate.gateway.plan.live import plan_pool
from spillgate.gateway.serving.exchange import Attempt
from spillgate.gateway.tenancy.tenants import Tenant
from tests.support.procs import free_port

TENANT = Tenant("t", frozenset({"*"}), ttft_slo_s=1.0, tpot_slo_s=0.05)
SEED_FLEET = fleet(OperatingPoint(48, 1140), Traffic(3000, 300, 50, 0.3, 1 / 3), GPUS["h100-80gb"], 2)
"""The worked example's fleet, as ``spillgate plan`` computes it: 18 replicas."""


def raw_config(**capacity: object) -> dict:
    settings = {"rate_window_s": 10, "lookback_s": 600, "sustain_s": 30, **capacity}
    return {
        "pools": [
            {
                "name": "pool",
                "served_model": "m",
                "replicas": ["http://127.0.0.1:1"],
                "output_tokens_per_s": 1140,
                "gpu_usd_per_hour": 6.0,
            },
            {"name": "other", "served_model": "m", "replicas": ["http://127.0.0.1:2"]},
        ],
        "hosted_models": [{"name": "frontier", "model": "openai/gpt-4o"}],
        "routes": [
            {"name": "chat", "targets": ["pool", "frontier"]},
            {"name": "both", "targets": ["pool", "other", "frontier"]},
        ],
        "auth": {"required": False},
        "capacity": settings,
    }


def make_config(**capacity: object) -> GatewayConfig:
    return parse_config(raw_config(**capacity))


def replica(name: str = "pool-0", pool: str = "pool") -> Backend:
    backend = Backend(name, "replica", "http://127.0.0.1:1", "m")
    backend.pool = pool
    return backend


HOSTED = Backend("frontier", "hosted", "", "gpt-4o")


class Pool:
    """A recorder over ``make_config``'s pools, fed and read at invented times."""

    def __init__(self, config: GatewayConfig | None = None, **capacity: object) -> None:
        self.config = config or make_config(**capacity)
        self.replicas = [replica()]
        self.recorder = CapacityRecorder()
        self.recorder.configure(self.config, [b.name for b in self.replicas], 0.0)

    def serve(self, start: float, seconds: float, rps: float, **attempt: object) -> None:
        """``rps`` requests a second of 3,000 in / 300 out tokens, each done a second after it arrived."""
        for i in range(round(seconds * rps)):
            t = start + i / rps
            fields = {
                "route": "chat",
                "tenant": TENANT,
                "served_by": self.replicas[0],
                "reason": "least_load",
                "outcome": "ok",
                "usage": {"prompt_tokens": 3000, "completion_tokens": 300},
                "first_token_at": t + 0.5,
                **attempt,
            }
            self.recorder.finished(Attempt(request_id=str(i), started=t, **fields), t + 1.0)  # type: ignore[arg-type]

    def sample_every_second(self, start: float, end: float, **load: int | float) -> None:
        for backend in self.replicas:
            backend.load = ReplicaLoad(**load)  # type: ignore[arg-type]
        for t in range(int(start), int(end) + 1):
            self.recorder.sample(self.replicas, float(t))

    def advice(self, now: float, pool: str = "pool") -> PoolAdvice:
        settings = self.config.capacity
        config = next(p for p in self.config.pools if p.name == pool)
        return advise(
            self.recorder.measures(config, self.replicas, None, now),
            headroom=settings.headroom,
            sustain_s=settings.sustain_s,
            min_replicas=settings.min_replicas,
        )


# The bucketed series and the peak --------------------------------------------------------------------------


def test_series_is_a_bounded_ring() -> None:
    series = BucketSeries(1.0, 3)
    for t in range(10):
        series.add(t + 0.5, t)
    assert series.recent(9.9) == [7, 8, 9]
    series.add(2.0, 100)  # long out of the ring: dropped, not written over a newer bucket
    assert series.recent(9.9) == [7, 8, 9]
    assert series.recent(11.0) == [9, 0, 0]
    assert series.total(100.0) == 0


def test_peak_is_the_best_window_anywhere_in_the_lookback() -> None:
    counts = [0, 1, 5, 5, 1, 0, 0]
    assert peak_rate(counts, bucket_s=0.5, window_buckets=2) == (10.0, 3)  # 10 in one second, ended 3 buckets ago
    assert peak_rate([2, 2], bucket_s=1.0, window_buckets=10) == (0.4, 0)  # shorter than a window: over a window
    assert peak_rate([], 1.0, 10) == (0.0, 0)


# The arithmetic on the worked example ----------------------------------------------------------------------


def test_worked_example_fed_as_load_gives_the_plans_replicas() -> None:
    pool = Pool(headroom=0.3)
    pool.serve(start=0.0, seconds=60, rps=50)
    advice = pool.advice(now=62.0)
    m = advice.measures
    assert m.peak_rps == pytest.approx(50)
    assert (m.mean_input_tokens, m.mean_output_tokens) == (3000, 300)
    assert advice.output_tps_source == "configured"
    assert advice.fleet is not None
    assert f"{advice.fleet.rps_per_replica:.1f}" == "3.8"
    assert advice.fleet.required_rps == pytest.approx(65)
    assert advice.recommended == advice.fleet.replicas == SEED_FLEET.replicas == 18
    assert advice.reason == "demand"
    assert advice.fleet.cost_per_day == pytest.approx(SEED_FLEET.cost_per_day)  # 18 x $6/replica-hour = 36 x $3/GPU


def test_overflow_spills_are_demand_complex_ones_are_not() -> None:
    pool = Pool(headroom=0.3)
    pool.serve(0.0, 60, 25)
    pool.serve(0.01, 60, 25, served_by=HOSTED, reason="overflow", cost_usd=0.01)
    pool.serve(0.02, 60, 25, served_by=HOSTED, reason="complex", cost_usd=0.05)
    advice = pool.advice(62.0)
    assert advice.measures.peak_rps == pytest.approx(50)
    assert advice.measures.overflow_requests == pytest.approx(1500)
    assert advice.measures.overflow_usd == pytest.approx(15.0)
    assert advice.recommended == 18


def test_refused_requests_are_demand_of_the_route_pools_serving_the_tenant() -> None:
    pool = Pool()
    for i in range(30):
        pool.recorder.refused(Attempt(request_id=str(i), started=i / 10, route="both", tenant=TENANT))
    assert pool.advice(4.0).measures.refused_requests == pytest.approx(15)
    assert pool.advice(4.0).measures.requests == pytest.approx(15)
    assert pool.advice(4.0, pool="other").measures.refused_requests == pytest.approx(15)
    assert pool.advice(4.0).measures.overflow_requests == 0


def test_overflow_of_a_route_over_two_pools_is_shared_between_them() -> None:
    pool = Pool()
    pool.serve(0.0, 10, 10, served_by=HOSTED, reason="overflow", route="both")
    assert pool.advice(11.0).measures.requests == pytest.approx(50)
    assert pool.advice(11.0, pool="other").measures.requests == pytest.approx(50)


def test_overflow_of_a_tenant_with_dedicated_pools_is_theirs_alone() -> None:
    raw = raw_config()
    keys = {"shared": "sk-shared-key", "own": "sk-dedicated-key"}
    raw["tenants"] = [
        {"name": "shared", "keys": [keys["shared"]]},
        {"name": "own", "keys": [keys["own"]], "isolation": "dedicated", "dedicated_pools": ["other"]},
    ]
    raw["auth"] = {"required": True}
    pool = Pool(parse_config(raw))
    own = Tenant("own", frozenset({"*"}), dedicated_pools=frozenset({"other"}))
    pool.serve(0.0, 10, 10, served_by=HOSTED, reason="overflow", route="both", tenant=Tenant("shared", frozenset()))
    pool.serve(0.0, 10, 4, served_by=HOSTED, reason="overflow", route="both", tenant=own)
    assert pool.advice(11.0).measures.requests == pytest.approx(100)
    assert pool.advice(11.0, pool="other").measures.requests == pytest.approx(40)


# The scaling rule ------------------------------------------------------------------------------------------


def test_no_traffic_keeps_the_warm_minimum() -> None:
    advice = Pool(min_replicas=2).advice(100.0)
    assert advice.fleet is None and advice.recommended == 2 and advice.reason == "min_replicas"
    assert Pool(min_replicas=0).advice(100.0).recommended == 0


def test_sustained_queue_pressure_adds_a_replica_above_demand() -> None:
    pool = Pool(sustain_s=30)
    # 2 x 1.3 / 3.8: one replica is enough for the demand, but requests queue there and miss their TTFT (so its
    # throughput as seen is not one at the SLO, and the configured one stands).
    pool.serve(0.0, 60, 2, first_token_at=1e9)
    pool.sample_every_second(0, 29, queued=4)
    assert pool.advice(29.0).recommended == 1, "29 s of queueing is not yet sustained"
    pool.sample_every_second(30, 40, queued=4)
    advice = pool.advice(40.0)
    assert advice.fleet is not None and advice.fleet.replicas == 1
    assert advice.pressure_sustained and advice.pressure_floor == 2
    assert advice.recommended == 2 and advice.reason == "pressure"


def test_sustained_kv_pressure_counts_too() -> None:
    pool = Pool(sustain_s=30, kv_high=0.9)
    pool.sample_every_second(0, 40, token_usage=0.95)
    assert pool.advice(40.0).recommended == 2
    calm = Pool(sustain_s=30, kv_high=0.9)
    calm.sample_every_second(0, 40, token_usage=0.85)
    assert calm.advice(40.0).recommended == 1


def test_a_short_blip_adds_nothing() -> None:
    pool = Pool(sustain_s=30)
    for start in (0, 20, 40):  # queueing for 15 s at a time, cleared in between
        pool.sample_every_second(start, start + 15, queued=5)
        pool.sample_every_second(start + 16, start + 19, queued=0)
    advice = pool.advice(60.0)
    assert not advice.pressure_sustained and advice.pressure_floor is None
    assert advice.recommended == 1


def test_a_resized_pool_must_sustain_pressure_again() -> None:
    pool = Pool(sustain_s=30)
    pool.sample_every_second(0, 40, queued=4)
    assert pool.advice(40.0).pressure_floor == 2
    pool.replicas.append(replica("pool-1"))
    pool.sample_every_second(41, 60, queued=4)
    assert pool.advice(60.0).pressure_floor == 2, "the second replica is new: no third yet"
    pool.sample_every_second(61, 75, queued=4)
    assert pool.advice(75.0).pressure_floor == 3


def test_scale_down_waits_for_the_lookback() -> None:
    pool = Pool(lookback_s=600, headroom=0.3)
    pool.serve(0.0, 60, 50)
    assert pool.advice(300.0).recommended == 18, "the peak an hour's lookback holds still counts"
    assert pool.advice(645.0).recommended == 18, "a whole window of the peak is still in the lookback"
    assert pool.advice(700.0).recommended == 1, "past the lookback: down to the warm minimum"


def test_a_replica_added_for_pressure_is_kept_for_the_lookback() -> None:
    pool = Pool(sustain_s=30, lookback_s=600)
    pool.sample_every_second(0, 40, queued=4)
    pool.sample_every_second(41, 45, queued=0)
    advice = pool.advice(300.0)
    assert not advice.pressure_sustained and advice.recommended == 2
    assert pool.advice(641.0).recommended == 1


# The throughput at the SLO: configured until measured ------------------------------------------------------


def _saturated_windows(pool: Pool, *, late_share: float = 0.0, peers: int = 0) -> None:
    """Five windows of 10 s with the replica at max_running, serving 5 RPS of 300 tokens (1,500 tok/s)."""
    backend = pool.replicas[0]
    backend.max_running = 48
    backend.peers.in_flight = peers
    pool.sample_every_second(0, 50, running=48)
    pool.serve(0.0, 50, 5)
    if late_share:  # that many more, spread evenly, missing their TTFT
        pool.serve(0.001, 50, 5 * late_share, first_token_at=1e9, usage={"prompt_tokens": 1, "completion_tokens": 0})


def test_saturated_windows_within_the_slo_replace_the_configured_throughput() -> None:
    pool = Pool()
    _saturated_windows(pool)
    advice = pool.advice(55.0)
    assert advice.output_tps_source == "measured"
    assert advice.output_tps == pytest.approx(1500)
    assert advice.measures.measured_windows >= 3
    assert advice.fleet is not None and advice.fleet.rps_per_replica == pytest.approx(5)


@pytest.mark.parametrize(("late_share", "peers"), [(0.1, 0), (0.0, 2)])
def test_throughput_stays_configured_off_the_slo_or_with_others_load(late_share: float, peers: int) -> None:
    pool = Pool()
    _saturated_windows(pool, late_share=late_share, peers=peers)
    advice = pool.advice(55.0)
    assert advice.output_tps_source == "configured" and advice.output_tps == 1140


def test_unsaturated_replicas_leave_the_configured_throughput() -> None:
    pool = Pool()
    pool.serve(0.0, 50, 5)
    pool.sample_every_second(0, 50, running=3)
    assert pool.advice(55.0).output_tps_source == "configured"


# Config, and the CLI's side ----------------------------------------------------------------------------


def test_capacity_defaults() -> None:
    settings = make_config().model_copy().capacity
    defaults = type(settings)()
    assert (defaults.headroom, defaults.rate_window_s, defaults.lookback_s) == (0.3, 60, 3600)
    assert (defaults.sustain_s, defaults.kv_high, defaults.min_replicas) == (300, 0.9, 1)


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        ({"rate_window_s": 60, "lookback_s": 30}, "lookback_s must be at least rate_window_s"),
        ({"rate_window_s": 1, "lookback_s": 86400}, "at most 10,000 rate windows"),
        ({"headroom": -0.1}, "capacity.headroom"),
        ({"kv_high": 1.5}, "capacity.kv_high"),
        ({"min_replicas": -1}, "capacity.min_replicas"),
        ({"surprise": 1}, "capacity.surprise"),
    ],
)
def test_capacity_config_errors_name_the_field(capacity: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_config(**capacity)
    assert expected in str(info.value)


def test_a_new_window_starts_the_measurements_afresh() -> None:
    pool = Pool()
    pool.serve(0.0, 60, 50)
    pool.recorder.configure(make_config(headroom=0.5), ["pool-0"], 61.0)
    assert pool.advice(62.0).measures.requests == 3000, "a headroom change keeps the measurements"
    pool.recorder.configure(make_config(rate_window_s=5), ["pool-0"], 63.0)
    assert pool.advice(64.0).measures.requests == 0


def test_the_cli_plans_a_report_with_the_same_fleet() -> None:
    pool = Pool(headroom=0.3)
    pool.serve(0.0, 60, 50)
    advice = pool.advice(62.0)
    m = advice.measures
    report = {
        "pool": "pool",
        "replicas": 1,
        "recommended_replicas": advice.recommended,
        "reason": advice.reason,
        "headroom": 0.3,
        "demand": {
            "peak_rps": m.peak_rps,
            "mean_rps": m.mean_rps,
            "mean_input_tokens": m.mean_input_tokens,
            "mean_output_tokens": m.mean_output_tokens,
            "overflow_requests": 0,
            "overflow_usd": 0,
        },
        "throughput": {"output_tps_per_replica": 1140, "source": "configured"},
        "pressure": {"queue_depth": 0, "kv_usage": 0.0, "for_s": 0, "sustain_s": 30},
        "cost": {"gpu_usd_per_hour": 6.0, "hosted_price": {"input_per_mtok": 3, "output_per_mtok": 15}},
    }
    planned = plan_pool(report)
    assert planned.fleet == advice.fleet
    assert planned.hosted is not None and planned.hosted.avg_rps == pytest.approx(m.mean_rps)


def test_plan_from_an_unreachable_gateway_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["plan", "--from", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spillgate plan: --from: cannot reach {url}") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "http://127.0.0.1:1", "--peak-rps", "50"], "--from takes every figure from the gateway; drop"),
        (["--from", "localhost:8080"], "argument --from: expected the gateway's URL"),
        (["--token", "t", "--input-tokens", "1"], "--token is the gateway's metrics token, for --from URL"),
        (["--model", "llama-3.1-8b"], "the following arguments are required: --input-tokens"),
    ],
)
def test_from_flag_mistakes(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["plan", *args])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err

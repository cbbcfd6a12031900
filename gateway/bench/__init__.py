"""``spillgate bench``: a load generator and report for any OpenAI-compatible URL.

Python API::

    from spillgate.gateway.bench import BenchConfig, run_bench
    result = await run_bench(BenchConfig(url="http://127.0.0.1:8080", workload="gsp", concurrency=(4,)))
    result.levels[0].summary.ttft_ms.p99

Modules: ``config`` (what a run does), ``text`` and ``trace`` (prompt text), ``workloads`` (the requests),
``arrivals`` (Poisson arrivals, rate schedules), ``client`` (one measured streamed request), ``runner`` (one level
of load), ``stats`` (figures, per phase too), ``report`` (table and JSON), ``progress`` (stderr bar), ``api``
(``run_bench``), ``cli`` (the subcommand).
"""

from spillgate.gateway.bench.api import BenchError, BenchResult, LevelResult, run_bench
from spillgate.gateway.bench.config import AgentKnobs, BenchConfig, ChatKnobs, GspKnobs

__all__ = [
    "AgentKnobs",
    "BenchConfig",
    "BenchError",
    "BenchResult",
    "ChatKnobs",
    "GspKnobs",
    "LevelResult",
    "run_bench",
]

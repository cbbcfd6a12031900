"""A point-in-time read of the gateway's Prometheus registry: the very samples ``/metrics`` renders, so the
dashboard and a scrape cannot disagree."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry

Labels = Mapping[str, str]


class Samples:
    """Sample values by sample name (``spillgate_requests_total``, ``spillgate_ttft_seconds_bucket``, ...)."""

    def __init__(self, by_name: Mapping[str, list[tuple[Labels, float]]]) -> None:
        self._by_name = by_name

    @classmethod
    def read(cls, registry: CollectorRegistry) -> Samples:
        by_name: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
        for family in registry.collect():
            for sample in family.samples:
                by_name[sample.name].append((dict(sample.labels), float(sample.value)))
        return cls(by_name)

    def series(self, name: str) -> list[tuple[Labels, float]]:
        return list(self._by_name.get(name, ()))

    def sum_by(
        self, name: str, *labels: str, where: Callable[[Labels], bool] | None = None
    ) -> dict[tuple[str, ...], float]:
        """Like PromQL's ``sum by (labels) (name)``: values added up per combination of ``labels``."""
        totals: dict[tuple[str, ...], float] = defaultdict(float)
        for sample_labels, value in self.series(name):
            if where is None or where(sample_labels):
                totals[tuple(sample_labels.get(label, "") for label in labels)] += value
        return dict(totals)

    def buckets(self, histogram: str, label: str) -> dict[str, list[tuple[float, float]]]:
        """Cumulative ``(le, count)`` buckets of ``histogram`` per value of ``label``."""
        grouped: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for sample_labels, value in self.series(histogram + "_bucket"):
            grouped[sample_labels.get(label, "")].append((float(sample_labels["le"]), value))
        return dict(grouped)


def one(totals: Mapping[tuple[str, ...], float], *key: str) -> float:
    """A ``sum_by`` cell, 0 when that combination never occurred."""
    return totals.get(key, 0.0)


def keys(totals: Iterable[tuple[str, ...]], position: int = 0) -> list[str]:
    """The distinct values at ``position`` of ``sum_by`` keys, sorted."""
    return sorted({key[position] for key in totals})

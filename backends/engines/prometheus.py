"""Reading named figures out of a Prometheus exposition page, as engines publish their load."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from prometheus_client.parser import text_string_to_metric_families

_NONE: Mapping[str, str] = MappingProxyType({})


def read_figures(
    text: str,
    *,
    summed: Mapping[str, str] = _NONE,
    peak: Mapping[str, str] = _NONE,
    counters: Mapping[str, str] = _NONE,
) -> dict[str, float]:
    """Values by our names: ``summed`` gauges add up over their label sets (data-parallel ranks), ``peak``
    gauges take the largest, ``counters`` (named with their ``_total`` sample suffix) add up."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.samples:  # HELP and TYPE only: nothing observed yet, not a zero
            continue
        if family.name in summed:
            values[summed[family.name]] = sum(sample.value for sample in family.samples)
        elif family.name in peak:
            values[peak[family.name]] = max((sample.value for sample in family.samples), default=0.0)
        else:
            # A counter's family drops the ``_total`` suffix; its samples keep it (and add ``_created``).
            for sample in family.samples:
                if sample.name in counters:
                    key = counters[sample.name]
                    values[key] = values.get(key, 0.0) + sample.value
    return values


def labels_of(text: str, family_name: str) -> dict[str, str]:
    """The labels of the first sample of ``family_name`` (an ``_info``-style gauge), or an empty dict."""
    for family in text_string_to_metric_families(text):
        if family.name == family_name and family.samples:
            return dict(family.samples[0].labels)
    return {}

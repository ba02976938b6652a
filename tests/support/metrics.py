"""Reading Prometheus text in tests: samples by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    """The sample's value, 0 when absent (a counter or a label set never recorded)."""
    return samples(text).get((name, frozenset(labels.items())), 0.0)

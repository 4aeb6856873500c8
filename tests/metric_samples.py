"""Prometheus' text format read back into samples, as the tests of every role's metrics look them up."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Each sample's value by its name and its labels (sorted ``(name, value)`` pairs)."""


def samples(text: str) -> Samples:
    """Every sample of a scrape's ``text``."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


__all__ = ["Samples", "samples"]

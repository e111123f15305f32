"""Reading Prometheus text exposition in tests: one sample's value by name and labels."""

from __future__ import annotations

__all__ = ["Scrape", "parse_exposition"]


class Scrape:
    """The samples of one scrape."""

    def __init__(self, samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> None:
        self.samples = samples

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the sample with exactly these labels, if there is one."""
        return self.samples.get((name, frozenset(labels.items())))

    def names(self) -> set[str]:
        """Every sample name in the scrape."""
        return {name for name, _ in self.samples}

    def with_name(self, name: str) -> list[dict[str, str]]:
        """The label sets of every sample called ``name``."""
        return [dict(labels) for n, labels in self.samples if n == name]


def parse_exposition(text: str) -> Scrape:
    """Parse Prometheus text format (with prometheus_client's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Scrape(samples)

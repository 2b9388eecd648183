"""A strict little reader of the Prometheus text format (0.0.4), for tests: samples by name
and labels, and each family's HELP and TYPE as written."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Labels = frozenset[tuple[str, str]]


@dataclass
class Scrape:
    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        """The sample ``name{labels}``; fails if it is missing."""
        series = self.samples.get(name, {})
        key = frozenset(labels.items())
        assert key in series, f"no {name}{labels} in {sorted(map(dict, series))}"
        return series[key]

    def get(self, name: str, default: float = 0.0, **labels: str) -> float:
        return self.samples.get(name, {}).get(frozenset(labels.items()), default)

    def label_names(self, name: str) -> set[frozenset[str]]:
        return {frozenset(k for k, _ in labels) for labels in self.samples.get(name, {})}


def parse(text: str) -> Scrape:
    scrape = Scrape()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            scrape.helps[name] = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            scrape.types[name] = kind
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            name, labels, value = match.groups()
            key = frozenset(_LABEL.findall(labels or ""))
            scrape.samples.setdefault(name, {})[key] = float(value)
    return scrape

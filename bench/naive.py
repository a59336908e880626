"""The naive design, for comparison: a prometheus_client custom collector that builds
GaugeMetricFamily / CounterMetricFamily objects from the same sample data on every scrape and
renders them with generate_latest, as most Python exporters do. It serves the samples of the
Sampler's last cycle, so both designs expose the same series."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.metrics import FAMILIES, Kind
from exporter.render import pod_label_name
from exporter.sampler import Sampler


class SampleCollector:
    """prometheus_client collector over the Sampler's last samples, rebuilt per scrape."""

    def __init__(self, sampler: Sampler, pod_labels: tuple[str, ...]) -> None:
        self.sampler = sampler
        self.pod_label_names = tuple(pod_label_name(k) for k in pod_labels)
        self.pod_labels = pod_labels

    def collect(self) -> Iterator[Metric]:
        samples = self.sampler._rendering.samples
        for fam in FAMILIES:
            rows = samples.get(fam.name)
            if not rows:
                continue
            extra = self.pod_label_names if fam.pod_labels else ()
            names = [*fam.labels, *extra]
            metric: Any
            if fam.kind is Kind.COUNTER:
                metric = CounterMetricFamily(fam.name, fam.help, labels=names)
            else:
                metric = GaugeMetricFamily(fam.name, fam.help, labels=names)
            for labels, value, pod_labels in rows:
                pods = dict(pod_labels)
                values = [*labels, *(pods.get(k, "") for k in self.pod_labels)] if extra \
                    else list(labels)
                metric.add_metric(values, value)
            yield metric


class NaiveSource:
    """exporter.web.MetricsSource that renders with generate_latest on every scrape (gzip
    with prometheus_client's own default, gzip.compress level 9)."""

    def __init__(self, sampler: Sampler, pod_labels: tuple[str, ...] = ("team",)) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SampleCollector(sampler, pod_labels))  # type: ignore[arg-type]

    def exposition(self, openmetrics: bool, gzipped: bool) -> bytes:
        body = generate_latest(self.registry)
        return gzip.compress(body) if gzipped else body

    def health(self) -> tuple[bool, str]:
        return True, "ok"

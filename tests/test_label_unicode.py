"""One bad label must not freeze the node's metrics (issue 14, attack 5): a pod label holding a
lone surrogate, as a broken or hostile API server can send in JSON (`"\\ud800"`), is replaced
and counted, and /healthz names the real cause when a cycle does stall."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from exporter.collectors import REGISTRY
from exporter.core import CollectorSpec, CycleContext, ExporterOptions, SampleSink
from exporter.render import Rendering
from exporter.sampler import Sampler
from tests.exporter_helpers import make_sampler, values

LONE = "team-\ud800x"  # what json.loads('"team-\\ud800x"') gives


@dataclass
class HostileLabels:
    """A collector adding one container sample with the given pod label value."""

    value: str
    name: str = "hostile"
    calls: int = 0
    needs_nvml: bool = False
    reads_processes: bool = False

    def collect(self, ctx: CycleContext, sink: SampleSink) -> int:
        self.calls += 1
        sink.add("gpu_container_memory_used_bytes",
                 ("node-a", "ml", "p\udc80d", "main", "GPU-1", ""), 1.0,
                 (("team", self.value),))
        return 0

    def close(self) -> None:
        pass


def with_collector(collector: object, threaded: bool = False) -> Sampler:
    sampler, _, _ = make_sampler(threaded=threaded)
    spec = CollectorSpec("hostile", True, "test", lambda deps: collector)  # type: ignore[arg-type,return-value]
    specs = [s for s in REGISTRY if s.name != "attribution"] + [spec]
    return Sampler(sampler.backend, sampler.options, specs, clock=sampler.clock,
                   threaded=threaded)


def test_lone_surrogate_label_is_replaced_and_counted() -> None:
    sampler = with_collector(HostileLabels(LONE))
    for cycle in (1, 2):
        rendering = sampler.cycle()
        for om in (False, True):
            body = rendering.body(om, False)
            text = body.decode("utf-8")  # valid UTF-8, whatever the labels held
            assert 'label_team="team-\ufffdx"' in text and 'pod="p\ufffdd"' in text
        # Two values repaired per cycle (the pod name and the label), counted cumulatively.
        assert values(rendering.body(False, False),
                      "gpu_exporter_label_values_replaced_total") == [2 * cycle]
    assert sampler.health() == (True, "ok")


def test_valid_unicode_is_untouched_and_not_counted() -> None:
    sampler = with_collector(HostileLabels("équipe-数据"))
    body = sampler.cycle().body(False, False)
    assert 'label_team="équipe-数据"' in body.decode("utf-8")
    assert 'pod="p\ufffdd"' in body.decode("utf-8")  # the pod name still needed repair
    assert values(body, "gpu_exporter_label_values_replaced_total") == [1]


@dataclass
class Hang:
    name: str = "hang"
    release: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    needs_nvml: bool = False
    reads_processes: bool = False

    def collect(self, ctx: CycleContext, sink: SampleSink) -> int:
        self.entered.set()
        self.release.wait(10)
        return 0

    def close(self) -> None:
        self.release.set()


def test_healthz_names_the_stage_a_cycle_is_stuck_in() -> None:
    hang = Hang()
    sampler = with_collector(hang, threaded=True)
    sampler.options = ExporterOptions(node="node-a", interval=0.05)
    sampler.stale_after = 0.0
    sampler._last_cycle_end = sampler.clock() - 1  # one cycle completed long ago
    sampler.start()
    try:
        assert hang.entered.wait(10)
        sampler.clock.now += 42  # type: ignore[attr-defined]
        ok, reason = sampler.health()
        assert not ok and "stuck in collector hang for 42s" in reason, reason
        assert "NVML hung" not in reason
    finally:
        hang.release.set()
        sampler.close()


def test_healthz_names_the_error_of_a_failed_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = with_collector(HostileLabels("ok"), threaded=True)
    sampler.stale_after = 0.0

    def broken(self: Rendering, samples: object, eager: bool = True) -> None:
        raise UnicodeEncodeError("utf-8", "x", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(Rendering, "__init__", broken)
    try:
        sampler._last_cycle_end = sampler.clock() - 1
        sampler.start()
        deadline = time.monotonic() + 10
        while not sampler._cycle_error and time.monotonic() < deadline:
            time.sleep(0.01)
        sampler.clock.now += 5  # type: ignore[attr-defined]
        ok, reason = sampler.health()
        assert not ok and "the last cycle failed in rendering: UnicodeEncodeError" in reason
    finally:
        sampler.close()

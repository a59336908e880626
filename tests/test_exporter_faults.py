"""The exporter on a simulated node: lost GPUs, missing driver, unsupported fields, a broken
collector, XIDs and a hung NVML. Each must degrade one value or one GPU, never the scrape."""

from __future__ import annotations

import threading
import time
import urllib.request

from exporter.web import start_server
from tests.exporter_helpers import SCENARIO, make_sampler, samples, values


def test_gpu_lost_marks_only_that_gpu_down_and_counts_xid_79() -> None:
    sampler, clock, _ = make_sampler()
    before = sampler.cycle().body(False, False)
    assert values(before, "gpu_up") == [1, 1, 1]
    clock.now += 3600 + 5  # fault: GPU 1 lost at 1h
    after = sampler.cycle().body(False, False)
    assert sorted(values(after, "gpu_up")) == [0, 1, 1]
    assert values(after, "gpu_up", gpu="1") == [0]
    assert values(after, "gpu_xid_errors_total", gpu="1", xid="79") == [1]
    # Other GPUs keep every reading; the lost one keeps its identity but loses readings.
    assert values(after, "gpu_temperature_celsius", gpu="2")
    assert not values(after, "gpu_temperature_celsius", gpu="1")
    assert values(after, "gpu_info", gpu="1") == [1]
    assert values(after, "gpu_exporter_collector_success", collector="device") == [1]


def test_no_driver_serves_self_metrics_and_retries_init() -> None:
    text = SCENARIO + "driver: {unavailable_until: 30s}\n"
    sampler, clock, _ = make_sampler(text)
    body = sampler.cycle().body(False, False)
    assert values(body, "gpu_exporter_source_up", source="nvml") == [0]
    assert values(body, "gpu_exporter_build_info")
    errors = [k for k in samples(body) if k[0] == "gpu_exporter_source_error_info"]
    assert errors and ("source", "nvml") in errors[0][1]
    assert not values(body, "gpu_up")
    ok, reason = sampler.health()
    assert not ok and "NVML init failed" in reason
    clock.now += 60  # driver loaded now; the retry backoff (1s, 2s, ...) has passed
    body = sampler.cycle().body(False, False)
    assert values(body, "gpu_exporter_source_up", source="nvml") == [1]
    assert len(values(body, "gpu_up")) == 3
    assert sampler.health() == (True, "ok")


def test_not_supported_field_is_absent_not_an_error() -> None:
    sampler, _, _ = make_sampler()
    body = sampler.cycle().body(False, False)
    assert not values(body, "gpu_memory_temperature_celsius", gpu="1")
    assert values(body, "gpu_memory_temperature_celsius", gpu="2")
    # MIG-enabled GPU 0 has no device utilisation: absent, and still a success.
    assert not values(body, "gpu_utilization_ratio", gpu="0")
    assert values(body, "gpu_utilization_ratio", gpu="2")
    assert values(body, "gpu_exporter_collector_success", collector="device") == [1]


def test_unexpected_nvml_error_drops_one_value_and_flags_collector() -> None:
    sampler, _, nvml = make_sampler()
    original = nvml.nvmlDeviceGetPowerUsage

    def broken(handle):  # an unknown error on one GPU only
        if handle is sampler_handles[2]:
            raise nvml.NVMLError(nvml.NVML_ERROR_UNKNOWN)
        return original(handle)

    sampler.cycle()
    sampler_handles = {g.index: g.handle for g in sampler.inventories()[0].gpus}
    nvml.nvmlDeviceGetPowerUsage = broken  # type: ignore[method-assign]
    body = sampler.cycle().body(False, False)
    assert not values(body, "gpu_power_watts", gpu="2")
    assert values(body, "gpu_power_watts", gpu="1")
    assert values(body, "gpu_temperature_celsius", gpu="2")
    assert values(body, "gpu_exporter_collector_success", collector="device") == [0]


def test_crashing_collector_fails_alone() -> None:
    sampler, _, _ = make_sampler()
    ecc = next(c for c in sampler.collectors if c.name == "ecc")

    def boom(ctx, sink):
        raise RuntimeError("bug")

    ecc.collect = boom  # type: ignore[method-assign]
    body = sampler.cycle().body(False, False)
    assert values(body, "gpu_exporter_collector_success", collector="ecc") == [0]
    assert values(body, "gpu_exporter_collector_success", collector="device") == [1]
    assert len(values(body, "gpu_up")) == 3


def test_xid_thread_counts_events_as_the_clock_passes_them() -> None:
    sampler, clock, _ = make_sampler(threaded=True)
    try:
        sampler.cycle()  # registers the event set and starts the XID thread
        assert not values(sampler.cycle().body(False, False), "gpu_xid_errors_total")
        clock.now += 601  # the scenario's XID 13 on GPU 0 at 10m
        deadline = time.monotonic() + 5
        found: list[float] = []
        while time.monotonic() < deadline and not found:
            time.sleep(0.05)
            found = values(sampler.cycle().body(False, False), "gpu_xid_errors_total",
                           gpu="0", xid="13")
        assert found == [1]
        # Counted once, however many cycles render it.
        time.sleep(0.3)
        body = sampler.cycle().body(False, False)
        assert values(body, "gpu_xid_errors_total", gpu="0", xid="13") == [1]
        assert values(body, "gpu_xid_last_timestamp_seconds", gpu="0", xid="13") == [clock.now]
    finally:
        sampler.close()


def test_hung_nvml_never_blocks_a_scrape() -> None:
    sampler, clock, nvml = make_sampler()
    sampler.cycle()
    release = threading.Event()
    original = nvml.nvmlDeviceGetTemperature

    def hang(*args):
        release.wait(20)
        return original(*args)

    nvml.nvmlDeviceGetTemperature = hang  # type: ignore[method-assign]
    sampler.stale_after = 0.5
    sampler.threaded = True
    sampler.start()
    server = start_server(sampler, "127.0.0.1", 0, None)
    try:
        time.sleep(0.2)
        clock.now += 5  # the sampler thread is stuck inside NVML now
        # NVML is stuck for 20 s; a scrape that waited on it would hit this 5 s timeout.
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as resp:
            body = resp.read()
        assert values(body, "gpu_up")  # the last good snapshot
        try:
            urllib.request.urlopen(f"{server.url}/healthz", timeout=5)
            raise AssertionError("healthz should fail while sampling is stalled")
        except urllib.error.HTTPError as err:
            assert err.code == 503
            assert b"no completed sample" in err.read()
    finally:
        release.set()
        server.shutdown()
        sampler.close()

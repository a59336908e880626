"""The simulated NVML module: pynvml's API, semantics and units, driven by a fake clock."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pynvml
import pytest

from exporter.errors import ConfigError
from exporter.nvml_loader import load_nvml
from gpusim.node import processes_at
from gpusim.nvml import SimNVML
from gpusim.nvml_processes import UTILIZATION_BUFFER
from gpusim.scenario import load_scenario, loads_scenario

SCENARIOS = Path(__file__).parent.parent / "gpusim" / "scenarios"
T0 = 1_700_000_000.0
HOUR = 3600.0

NODE = """
node: sim-1
gpus:
  - model: NVIDIA H100 80GB HBM3
    memory: 80GiB
    reserved_memory: 512MiB
    power_limit_watts: 700
    nvlink_links: 4
    mig: [{profile: 3g.40gb}, {profile: 2g.20gb}]
    telemetry: {idle_power_watts: 100}
  - model: NVIDIA H100 80GB HBM3
    memory: 80GiB
    reserved_memory: 512MiB
    power_limit_watts: 700
    nvlink_links: 4
    telemetry: {idle_power_watts: 100, temperature: 40, memory_temperature: 50}
  - model: NVIDIA A100-SXM4-40GB
    memory: 40GiB
    power_limit_watts: 400
    not_supported: [memory_temperature]
  - model: NVIDIA A100-SXM4-40GB
    memory: 40GiB
    power_limit_watts: 400
    mig: [{profile: 7g.40gb}]
pods:
  - namespace: a
    name: mig-user
    containers:
      - name: c
        gpus: [{gpu: 0, mig: 0}]
        processes: [{memory: 10GiB, sm_util: 0.5}]
  - namespace: a
    name: whole
    start: 1h
    end: 5h
    containers:
      - name: c
        gpus: [1]
        processes:
          - {memory: 20GiB, sm_util: 0.75}
          - {memory: 4GiB, sm_util: 0.5}
  - namespace: b
    name: cron
    start: 10m
    end: 20m
    repeat: 1h
    containers:
      - name: c
        gpus: [2]
        processes: [{memory: 2GiB, sm_util: {sine: {min: 0.1, max: 0.9, period: 7m}}}]
faults:
  - {kind: lost, gpu: 3, at: 2h}
  - {kind: throttle, gpu: 1, at: 3h, duration: 30m, reason: hw_thermal}
  - {kind: ecc, gpu: 1, at: 1h, corrected: 5}
  - {kind: ecc, gpu: 1, at: 2h, corrected: 2, uncorrected: 1}
  - {kind: row_remap, gpu: 1, at: 2h, correctable: 1, pending: true}
  - {kind: pcie_replay, gpu: 1, at: 2h, count: 7}
  - {kind: nvlink_error, gpu: 1, at: 2h, link: 1, type: crc_flit, count: 3}
  - {kind: not_supported, gpu: 1, at: 4h, until: 4h30m, field: power}
xids:
  - {gpu: 1, at: 30m, xid: 13}
  - {gpu: 0, at: 1h, xid: 31, mig: 1}
  - {gpu: 1, at: 90m, xid: 48}
"""


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def at(self, t: float) -> None:
        self.now = T0 + t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def nv(clock: Clock) -> SimNVML:
    sim = SimNVML(loads_scenario(NODE, "node.yaml"), clock=clock)
    sim.nvmlInit()
    return sim


def code(info: pytest.ExceptionInfo[pynvml.NVMLError]) -> int:
    return int(info.value.value)


def test_mirrors_pynvml_names(nv):
    assert nv.NVML_TEMPERATURE_GPU == pynvml.NVML_TEMPERATURE_GPU
    assert nv.NVMLError is pynvml.NVMLError
    assert nv.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    assert nv.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t
    assert nv.nvmlMemory_v2 == pynvml.nvmlMemory_v2
    assert nv.nvmlClocksEventReasonGpuIdle == pynvml.nvmlClocksEventReasonGpuIdle
    assert nv.nvmlEventTypeXidCriticalError == pynvml.nvmlEventTypeXidCriticalError
    with pytest.raises(AttributeError):
        _ = nv.nvmlDeviceGetBoardId  # a real pynvml function the simulation lacks
    with pytest.raises(AttributeError):
        _ = nv.nvmlNoSuchFunction


def test_errors_are_pynvml_subclasses(nv):
    h = nv.nvmlDeviceGetHandleByIndex(2)  # an A100 with no NVLink links in the scenario
    with pytest.raises(pynvml.NVMLError_NotSupported) as info:
        nv.nvmlDeviceGetNvLinkState(h, 0)
    assert code(info) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert isinstance(info.value, nv.NVMLError)


def test_init_and_shutdown(clock):
    sim = SimNVML(loads_scenario(NODE), clock=clock)
    with pytest.raises(pynvml.NVMLError) as info:
        sim.nvmlDeviceGetCount()
    assert code(info) == pynvml.NVML_ERROR_UNINITIALIZED
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlShutdown()
    sim.nvmlInit()
    assert sim.nvmlDeviceGetCount() == 4
    assert sim.nvmlSystemGetDriverVersion() == "550.54.15"
    assert sim.nvmlSystemGetCudaDriverVersion() == 12040
    sim.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()


def test_no_driver_until(clock):
    sim = SimNVML(loads_scenario(NODE), clock=clock, no_driver_until=60)
    with pytest.raises(pynvml.NVMLError) as info:
        sim.nvmlInit()
    assert code(info) == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    clock.at(61)
    sim.nvmlInit()
    assert sim.nvmlDeviceGetCount() == 4


def test_scenario_driver_block(clock):
    text = NODE + "driver: {unavailable_until: 5m, error: library_not_found}\n"
    sim = SimNVML(loads_scenario(text), clock=clock)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        sim.nvmlInit()
    clock.at(300)
    sim.nvmlInit()


def test_identity(nv):
    h = nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    uuid = nv.nvmlDeviceGetUUID(h)
    assert uuid.startswith("GPU-") and len(uuid) == 40
    assert nv.nvmlDeviceGetHandleByUUID(uuid) == h
    assert nv.nvmlDeviceGetPciInfo(h).busId == "00000000:2A:00.0"
    assert nv.nvmlDeviceGetVirtualizationMode(h) == 0
    assert nv.nvmlDeviceGetMigMode(h) == [0, 0]
    assert nv.nvmlDeviceGetMigMode(nv.nvmlDeviceGetHandleByIndex(0)) == [1, 1]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetHandleByIndex(4)


def test_mig_handles(nv):
    parent = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    assert nv.nvmlDeviceGetGpuInstanceProfileInfo(
        parent, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE).sliceCount == 7
    m0 = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    m1 = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)  # an empty slot
    assert nv.nvmlDeviceIsMigDeviceHandle(m0) and not nv.nvmlDeviceIsMigDeviceHandle(parent)
    assert nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m1) == parent
    assert nv.nvmlDeviceGetName(m0) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert nv.nvmlDeviceGetUUID(m0).startswith("MIG-")
    gi0, gi1 = nv.nvmlDeviceGetGpuInstanceId(m0), nv.nvmlDeviceGetGpuInstanceId(m1)
    assert gi0 != gi1 and nv.nvmlDeviceGetComputeInstanceId(m0) == 0
    attrs = nv.nvmlDeviceGetAttributes(m0)
    assert (attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount) == (3, 3)
    assert attrs.memorySizeMB == 40 * 1024 and attrs.multiprocessorCount == 60
    mem = nv.nvmlDeviceGetMemoryInfo(m0)
    assert mem.total == 40 << 30 and mem.used == 10 << 30
    # processes: the MIG handle lists its own; the parent lists all with their GI/CI ids
    own = nv.nvmlDeviceGetComputeRunningProcesses(m0)
    assert [p.usedGpuMemory for p in own] == [10 << 30]
    all_procs = nv.nvmlDeviceGetComputeRunningProcesses(parent)
    assert [(p.gpuInstanceId, p.computeInstanceId) for p in all_procs] == [(gi0, 0)]
    assert nv.nvmlDeviceGetComputeRunningProcesses(m1) == []
    for fn in (nv.nvmlDeviceGetUtilizationRates, nv.nvmlDeviceGetEncoderUtilization,
               nv.nvmlDeviceGetDecoderUtilization):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            fn(parent)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetProcessUtilization(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetTemperature(m0, pynvml.NVML_TEMPERATURE_GPU)


def test_memory_is_processes_plus_reservation(nv, clock):
    h = nv.nvmlDeviceGetHandleByIndex(1)
    idle = nv.nvmlDeviceGetMemoryInfo(h)
    assert idle.used == 512 << 20 and idle.total == 80 << 30
    assert idle.free + idle.used == idle.total
    clock.at(2 * HOUR)
    v1 = nv.nvmlDeviceGetMemoryInfo(h)
    assert v1.used == (24 << 30) + (512 << 20)
    v2 = nv.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert (v2.used, v2.reserved) == (24 << 30, 512 << 20)
    assert v2.free + v2.used + v2.reserved == v2.total
    procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    assert sorted(p.usedGpuMemory for p in procs) == [4 << 30, 20 << 30]
    assert {p.gpuInstanceId for p in procs} == {0xFFFFFFFF}
    assert {p.pid for p in procs} == {p.pid for p in processes_at(nv.scenario, 2 * HOUR)
                                      if p.gpu == 1}


def test_utilization_follows_processes(nv, clock):
    h = nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetUtilizationRates(h).gpu == 0
    assert nv.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonGpuIdle
    clock.at(2 * HOUR)
    util = nv.nvmlDeviceGetUtilizationRates(h)
    assert util.gpu == 100  # 0.75 + 0.5 clamps at 100%
    assert 0 < util.memory <= 100
    assert not nv.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonGpuIdle
    assert nv.nvmlDeviceGetPowerUsage(h) == 630_000  # 0.9 x limit at full load, in mW
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    assert nv.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 40
    assert nv.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1410


def test_process_utilization_not_found_semantics(nv, clock):
    h = nv.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nv.nvmlDeviceGetProcessUtilization(h, 0)  # no processes yet
    clock.at(2 * HOUR + 0.5)
    samples = nv.nvmlDeviceGetProcessUtilization(h, 0)  # 0: all the driver still holds
    newest = max(s.timeStamp for s in samples)
    assert newest == int(T0 + 2 * HOUR) * 1_000_000
    assert len({s.timeStamp for s in samples}) == UTILIZATION_BUFFER
    # 75:50 scaled to sum to 100%
    assert sorted(s.smUtil for s in samples if s.timeStamp == newest) == [40, 60]
    # device samples on the same periods: the GPU was busy all the time
    kind, device = nv.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                                           newest - 3_000_000)
    assert kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert [(d.timeStamp, d.sampleValue.uiVal) for d in device] == \
        [(newest - i * 1_000_000, 100) for i in (2, 1, 0)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        nv.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, newest)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetSamples(h, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nv.nvmlDeviceGetProcessUtilization(h, newest)  # nothing newer yet
    clock.at(2 * HOUR + 1.5)
    again = nv.nvmlDeviceGetProcessUtilization(h, newest)
    assert {s.pid for s in again} == {s.pid for s in samples}
    assert all(s.timeStamp > newest for s in again)


def test_energy_is_the_integral_of_power(nv, clock):
    h = nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetTotalEnergyConsumption(h) == 0
    clock.at(HOUR)
    # idle for the first hour at 100 W
    assert nv.nvmlDeviceGetTotalEnergyConsumption(h) == pytest.approx(100 * HOUR * 1000, rel=1e-9)
    clock.at(2 * HOUR)
    # then busy at 630 W
    assert nv.nvmlDeviceGetTotalEnergyConsumption(h) == pytest.approx(
        (100 + 630) * HOUR * 1000, rel=1e-3)


def test_energy_is_monotonic_and_cadence_independent(clock):
    sc = loads_scenario(NODE)
    a, b = SimNVML(sc, clock=clock, start=T0), SimNVML(sc, clock=clock, start=T0)
    a.nvmlInit()
    b.nvmlInit()
    ha, hb = a.nvmlDeviceGetHandleByIndex(2), b.nvmlDeviceGetHandleByIndex(2)
    last, t = -1, 0.0
    for i in range(1, 400):  # an irregular cadence: 7s .. 13min steps
        t += 7 + (i * 37) % 780
        clock.at(t)
        e = a.nvmlDeviceGetTotalEnergyConsumption(ha)
        assert e >= last
        last = e
    # b reads only the final value: the same integral
    assert b.nvmlDeviceGetTotalEnergyConsumption(hb) == last


def test_month_long_clock(nv, clock):
    clock.at(30 * 86400 + 15 * 60)  # 30 days later, inside a cron run
    for i in range(3):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        assert nv.nvmlDeviceGetTotalEnergyConsumption(h) > 0
    h2 = nv.nvmlDeviceGetHandleByIndex(2)
    procs = nv.nvmlDeviceGetComputeRunningProcesses(h2)
    assert len(procs) == 1  # the cron pod's 720th run
    e = nv.nvmlDeviceGetTotalEnergyConsumption(h2)
    # A100 idle is 40 W; a cron run adds on top
    assert 40 * 30 * 86400 * 1000 < e < 400 * 30 * 86400 * 1000
    clock.at(30 * 86400 + 30 * 60)
    assert nv.nvmlDeviceGetComputeRunningProcesses(h2) == []


def test_lost_gpu(nv, clock):
    lost = nv.nvmlDeviceGetHandleByIndex(3)
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(lost, 0)
    assert nv.nvmlDeviceGetTemperature(lost, pynvml.NVML_TEMPERATURE_GPU) > 0
    clock.at(2 * HOUR)
    for call in (lambda: nv.nvmlDeviceGetTemperature(lost, pynvml.NVML_TEMPERATURE_GPU),
                 lambda: nv.nvmlDeviceGetUUID(lost), lambda: nv.nvmlDeviceGetMemoryInfo(mig),
                 lambda: nv.nvmlDeviceGetComputeRunningProcesses(lost),
                 lambda: nv.nvmlDeviceGetTotalEnergyConsumption(lost),
                 lambda: nv.nvmlDeviceGetFieldValues(lost, [pynvml.NVML_FI_DEV_MEMORY_TEMP])):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    assert nv.nvmlDeviceGetCount() == 4
    other = nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetUUID(other).startswith("GPU-")


def _drain(nv, es):
    got = []
    while True:
        try:
            got.append(nv.nvmlEventSetWait_v2(es, 0))
        except pynvml.NVMLError_Timeout:
            return got


def test_xids_delivered_exactly_once(nv, clock):
    es = nv.nvmlEventSetCreate()
    for i in range(4):
        nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(i),
                                    pynvml.nvmlEventTypeXidCriticalError, es)
    assert _drain(nv, es) == []
    clock.at(HOUR)
    first = _drain(nv, es)
    assert [(e.device, e.eventData) for e in first] == [
        (nv.nvmlDeviceGetHandleByIndex(1), 13), (nv.nvmlDeviceGetHandleByIndex(0), 31)]
    assert all(e.eventType == pynvml.nvmlEventTypeXidCriticalError for e in first)
    gi = nv.nvmlDeviceGetGpuInstanceId(
        nv.nvmlDeviceGetMigDeviceHandleByIndex(nv.nvmlDeviceGetHandleByIndex(0), 1))
    assert (first[0].gpuInstanceId, first[1].gpuInstanceId) == (0xFFFFFFFF, gi)
    assert _drain(nv, es) == []  # not again
    clock.at(30 * 86400)
    rest = _drain(nv, es)
    assert [e.eventData for e in rest] == [48, 79]  # and the lost GPU's XID 79
    assert rest[1].device == nv.nvmlDeviceGetHandleByIndex(3)
    assert _drain(nv, es) == []
    # a second set sees the events from when it registered on
    es2 = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(1),
                                pynvml.nvmlEventTypeXidCriticalError, es2)
    assert _drain(nv, es2) == []
    nv.nvmlEventSetFree(es)
    nv.nvmlEventSetFree(es2)


def test_event_wait_blocks_until_the_clock_passes(nv, clock):
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(1),
                                pynvml.nvmlEventTypeXidCriticalError, es)
    started = threading.Event()

    def advance():
        started.wait()
        time.sleep(0.1)
        clock.at(HOUR)

    mover = threading.Thread(target=advance)
    mover.start()
    started.set()
    event = nv.nvmlEventSetWait_v2(es, 5000)  # returns once the fake clock moves
    mover.join()
    assert event.eventData == 13
    nv.nvmlEventSetFree(es)


def test_event_wait_times_out(nv):
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(1),
                                pynvml.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(pynvml.NVMLError) as info:
        nv.nvmlEventSetWait(es, 100)
    assert code(info) == pynvml.NVML_ERROR_TIMEOUT
    nv.nvmlEventSetFree(es)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlEventSetWait(es, 0)


def test_field_values(nv):
    fid = pynvml.NVML_FI_DEV_MEMORY_TEMP
    h100 = nv.nvmlDeviceGetFieldValues(nv.nvmlDeviceGetHandleByIndex(1), [fid, 999])
    assert h100[0].fieldId == fid and h100[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert h100[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert h100[0].value.uiVal == 50
    assert h100[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    a100 = nv.nvmlDeviceGetFieldValues(nv.nvmlDeviceGetHandleByIndex(2), [fid])
    assert a100[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_not_supported_window(nv, clock):
    h = nv.nvmlDeviceGetHandleByIndex(1)
    clock.at(4 * HOUR + 60)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetPowerUsage(h)
    clock.at(4.5 * HOUR)
    assert nv.nvmlDeviceGetPowerUsage(h) > 0


def test_reliability_counters(nv, clock):
    h = nv.nvmlDeviceGetHandleByIndex(1)
    corrected = (h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)
    assert nv.nvmlDeviceGetTotalEccErrors(*corrected) == 0
    assert nv.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    clock.at(2 * HOUR)
    assert nv.nvmlDeviceGetTotalEccErrors(*corrected) == 7
    assert nv.nvmlDeviceGetTotalEccErrors(
        h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC) == 1
    assert nv.nvmlDeviceGetRemappedRows(h) == (1, 0, 1, 0)
    assert nv.nvmlDeviceGetPcieReplayCounter(h) == 7
    assert nv.nvmlDeviceGetNvLinkState(h, 1) == pynvml.NVML_FEATURE_ENABLED
    assert nv.nvmlDeviceGetNvLinkErrorCounter(h, 1, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 3
    assert nv.nvmlDeviceGetNvLinkErrorCounter(h, 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetNvLinkState(h, 4)  # beyond the GPU's links
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetNvLinkState(h, pynvml.NVML_NVLINK_MAX_LINKS)


def test_throttle_window(nv, clock):
    h = nv.nvmlDeviceGetHandleByIndex(1)
    clock.at(3 * HOUR + 60)
    reasons = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons & pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert nv.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) < 1410
    clock.at(5 * HOUR)
    assert not nv.nvmlDeviceGetCurrentClocksEventReasons(h) & \
        pynvml.nvmlClocksEventReasonHwThermalSlowdown
    thermal = nv.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_THERMAL)
    assert thermal.violationTime == 30 * 60 * 10**9
    assert nv.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER).violationTime == 0
    low = nv.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_LOW_UTILIZATION)
    assert low.violationTime == pytest.approx(HOUR * 1e9)  # idle for the first hour


def test_gpm(nv, clock):
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
    assert not nv.nvmlGpmQueryDeviceSupport(nv.nvmlDeviceGetHandleByIndex(2)).isSupportedDevice
    gi = nv.nvmlDeviceGetGpuInstanceId(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0))
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmMigSampleGet(h, gi, s1)
    clock.now += 5
    nv.nvmlGpmMigSampleGet(h, gi, s2)
    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = 3
    req.sample1, req.sample2 = s1, s2
    req.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    req.metrics[1].metricId = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    req.metrics[2].metricId = 9999
    nv.nvmlGpmMetricsGet(req)
    assert req.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert req.metrics[0].value == pytest.approx(50.0)  # the instance's one process
    assert req.metrics[1].value == pytest.approx(25.0)  # tensor default: half of SM
    assert req.metrics[2].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    # the whole GPU: a 3-slice instance at 50% of a 7-slice GPU
    nv.nvmlGpmSampleGet(h, s1)
    clock.now += 5
    nv.nvmlGpmSampleGet(h, s2)
    req.sample1, req.sample2 = s1, s2
    nv.nvmlGpmMetricsGet(req)
    assert req.metrics[0].value == pytest.approx(100 * 0.5 * 3 / 7)
    nv.nvmlGpmSampleFree(s1)
    nv.nvmlGpmSampleFree(s2)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlGpmSampleGet(nv.nvmlDeviceGetHandleByIndex(2), nv.nvmlGpmSampleAlloc())


@pytest.mark.parametrize("name", ["h100-mig.yaml", "a100-timeslice.yaml", "mixed.yaml"])
def test_examples_answer_every_gpu(name):
    clock = Clock()
    nv = SimNVML(load_scenario(SCENARIOS / name), clock=clock)
    nv.nvmlInit()
    clock.at(HOUR)
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        used = sum(p.usedGpuMemory for p in nv.nvmlDeviceGetComputeRunningProcesses(h))
        assert mem.used >= used
        assert nv.nvmlDeviceGetTotalEnergyConsumption(h) > 0


def test_mixed_example_loses_gpu_2():
    clock = Clock()
    nv = SimNVML(load_scenario(SCENARIOS / "mixed.yaml"), clock=clock)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(2)
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    clock.at(3 * HOUR)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetPowerUsage(h)
    assert [e.eventData for e in _drain(nv, es)] == [79]
    t4 = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetRemappedRows(t4)


def test_loader(tmp_path):
    assert load_nvml("real") is pynvml
    sim = load_nvml(f"sim:{SCENARIOS / 'mixed.yaml'}", clock=lambda: T0)
    assert isinstance(sim, SimNVML) and sim.start == T0
    with pytest.raises(ConfigError) as info:
        load_nvml("fake")
    assert "sim:PATH" in str(info.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("node: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_nvml(f"sim:{bad}")
    assert str(bad) in str(info.value)

"""One GPU history in several scrape topologies, for the de-duplication tests.

GPUs up from 02:00Z to 06:00Z on 2026-10-05; the pods hold in hour 03:00Z.
  node-a (scraped every 15 s): GPU-a0, GPU-a1, GPU-a2 (H100)
  node-b (scraped every 60 s): GPU-b0, GPU-b1 (H100)
Pods, each holding one whole GPU exclusively from 03:00:30 for M minutes (samples at
03:00:30 + k x spacing, k = 1 .. M x 60 / spacing), team tM:
  t5 on GPU-a0, t20 on GPU-a1, t30 on GPU-a2, t40 on GPU-b0, t59 on GPU-b1.
By hand: team tM holds M x 60 s (300, 1200, 1800, 2400, 3540), i.e. M/60 GPU-hours; every GPU
is observed 3600 s each hour. At 4.00 per device-hour (COST_MODEL) hour 03:00 bills t5 0.33,
t20 1.33, t30 2.00, t40 2.67, t59 3.93 and idle 20 - 154/60 x 4 = 9.73; later hours are idle
(20.00 each). Duplicates are scraped 7 s (60 s node) or 4 s (15 s node) after the original,
as a second job or replica would be.
"""

from __future__ import annotations

from datetime import UTC, datetime

H = int(datetime(2026, 10, 5, 3, tzinfo=UTC).timestamp())
H100 = "NVIDIA H100 80GB HBM3"
SPACING = {"node-a": 15, "node-b": 60}
OFFSET = {"node-a": 4, "node-b": 7}
GPUS = [("node-a", "GPU-a0", 5), ("node-a", "GPU-a1", 20), ("node-a", "GPU-a2", 30),
        ("node-b", "GPU-b0", 40), ("node-b", "GPU-b1", 59)]
COST_MODEL = "pricing:\n  default: {hourly: 4.00}\n"
Sample = tuple[str, dict[str, str], float, float]  # family, labels, value, time


def expected_bill(hours: tuple[int, ...] = (3, 4, 5)) -> dict[tuple[str, str], float]:
    """(hour, team) -> cost at 4.00 per device-hour, by hand (module docstring)."""
    bill: dict[tuple[str, str], float] = {}
    for h in hours:
        hour = f"2026-10-05 {h:02d}:00:00"
        held = sum(m for _, _, m in GPUS) / 60 if h == 3 else 0.0
        bill[(hour, "idle")] = round(4 * (5 - held), 2)
        if h == 3:
            for _, _, m in GPUS:
                bill[(hour, f"t{m}")] = round(4 * m / 60, 2)
    return bill


def clean_samples() -> list[Sample]:
    out: list[Sample] = []
    for i, (node, uuid, minutes) in enumerate(GPUS):
        dt = SPACING[node]
        dev = {"node": node, "gpu": str(i), "uuid": uuid, "model": H100}
        for t in range(H - 3600 + dt, H + 3 * 3600 + 1, dt):
            out.append(("gpu_up", dev, 1.0, t))
            out.append(("gpu_info", {"node": node, "uuid": uuid, "mig_mode": "disabled"}, 1.0, t))
        pod = {"node": node, "namespace": f"ns{minutes}", "pod": f"p{minutes}",
               "container": "main", "uuid": uuid, "mig_uuid": "",
               "resource": "nvidia.com/gpu", "sharing": "exclusive", "replicas": "1",
               "label_team": f"t{minutes}"}
        start = H + 30
        for k in range(1, minutes * 60 // dt + 1):
            out.append(("gpu_container_allocation", pod, 1.0, start + k * dt))
    return out


def scraped(samples: list[Sample], **scrape: str) -> list[Sample]:
    return [(f, {**lab, **scrape}, v, t) for f, lab, v, t in samples]


def copy_later(samples: list[Sample], **scrape: str) -> list[Sample]:
    """The same samples scraped a few seconds later (a second job or replica)."""
    return [(f, {**lab, **scrape}, v, t + OFFSET[lab["node"]]) for f, lab, v, t in samples]


def openmetrics(samples: list[Sample]) -> str:
    """promtool backfill input (seconds)."""
    lines: list[str] = []
    for family in sorted({s[0] for s in samples}):
        lines.append(f"# TYPE {family} gauge")
        for f, lab, v, t in sorted((s for s in samples if s[0] == family),
                                   key=lambda s: (sorted(s[1].items()), s[3])):
            body = ",".join(f'{k}="{x}"' for k, x in lab.items())
            lines.append(f"{f}{{{body}}} {v} {t}")
    return "\n".join([*lines, "# EOF"]) + "\n"


def prometheus_text(samples: list[Sample]) -> str:
    """VictoriaMetrics /api/v1/import/prometheus input (millisecond timestamps)."""
    return "".join(
        f"{f}{{{','.join(f'{k}={chr(34)}{x}{chr(34)}' for k, x in lab.items())}}} {v} "
        f"{int(t * 1000)}\n" for f, lab, v, t in samples)

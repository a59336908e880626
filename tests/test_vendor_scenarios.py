"""The AMD and Intel scenarios of issue 25 item 8 (gpusim/scenarios/vendors): an MI300X in
CPX/NPS4 with pods on partitions, an MxGPU host with VFs, an Intel Max with SR-IOV VFs and an
iGPU GVT-g host with virt-launcher pods. Their series (gpusim.vendor_history) go through the
real ingest path, are priced with the packaged cost model and reported: every holder pays
its fraction, by hand below, and the whole MI300X that fits one XCD is told to use CPX."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from exporter.errors import ConfigError
from gpusim.vendor_history import load_vendor_scenario, openmetrics
from metering.costmodel import load_cost_model
from metering.db import connect
from metering.ingest import ingest
from metering.openmetrics_source import OpenMetricsSource
from metering.period import Month, resolve
from metering.pricing import price_period
from metering.report import cli as report_cli
from metering.report.waste import Kind, Settings, mig_fraction, recommend
from metering.selector import DEFAULT_SELECTOR

ROOT = Path(__file__).resolve().parent.parent
VENDORS = ROOT / "gpusim" / "scenarios" / "vendors"
SCENARIOS = sorted(VENDORS.glob("*.yaml"))
HOURS = 96  # 2026-10-01 .. 10-05: enough busy hours (72) for a rightsizing
T0 = int(datetime(2026, 10, 1, tzinfo=UTC).timestamp())


def test_the_four_scenarios_load() -> None:
    names = {p.name for p in SCENARIOS}
    assert names == {"mi300x-cpx.yaml", "mxgpu-host.yaml", "intel-max-sriov.yaml",
                     "intel-igpu-gvtg.yaml", "intel-max-tiles.yaml"}
    sc = load_vendor_scenario(VENDORS / "mi300x-cpx.yaml")
    assert (sc.gpus[0].profile, sc.gpus[0].partitions, sc.gpus[0].vendor) == (
        "cpx_nps4", 8, "amd")


def test_a_bad_scenario_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("node: n1\ngpus:\n  - {model: X, vendor: amd, memory: 1GiB,"
                   " partitions: {profile: cpx_nps3, count: 8}}\n")
    with pytest.raises(ConfigError) as e:
        load_vendor_scenario(bad)
    assert str(e.value).count("\n") == 0 and "gpus[0].partitions.profile" in str(e.value)


def test_vendor_nodes_metered_priced_and_reported(tmp_path: Path) -> None:
    om = tmp_path / "vendors.om"
    om.write_text(openmetrics(list(SCENARIOS), T0, HOURS, 900))
    period = resolve(None, "2026-10-01T00:00", "2026-10-05T00:00")
    src = OpenMetricsSource(str(om), period, DEFAULT_SELECTOR)
    db = tmp_path / "m.duckdb"
    con = connect(db)
    try:
        ingest(con, src, period)
    finally:
        src.close()
    cm = load_cost_model(None)  # the packaged cost-model.yaml
    result = price_period(con, cm, period.start, period.end)
    assert result.total == result.fleet_cost and result.default_priced_models == ()
    pods = dict(con.execute("SELECT pod, sum(cost) FROM charges WHERE pod <> '' "
                            "GROUP BY pod").fetchall())
    D = Decimal
    mi300x, max1550, uhd = D("3.20"), D("1.50"), D("0.05")  # cost-model.yaml
    assert pods == {
        # CPX/NPS4 partitions: 1/8 of an MI300X each; the notebook runs all 96 hours.
        "vllm-small-0": HOURS * mi300x / 8, "vllm-small-1": HOURS * mi300x / 8,
        "notebook-ana": HOURS * mi300x / 8,
        "embedder-0": HOURS * mi300x,
        # MxGPU: a VF of 4 on an MI300X.
        "virt-launcher-vm-render": HOURS * mi300x / 4, "virt-launcher-vm-ci": HOURS * mi300x / 4,
        "virt-launcher-vm-train": HOURS * mi300x / 4,
        # Intel Max SR-IOV: a VF of 4.
        "virt-launcher-vm-sim": HOURS * max1550 / 4, "virt-launcher-vm-viz": HOURS * max1550 / 4,
        # GVT-g: V5_4 = 1/4, V5_8 = 1/8 (bob runs hours 0-96).
        "virt-launcher-desk-alice": HOURS * uhd / 4, "virt-launcher-desk-bob": HOURS * uhd / 8,
        # Intel Max tiles: 1 of 2 each (finetune-1 runs hours 0-48).
        "lammps-0": HOURS * max1550 / 2, "finetune-1": 48 * max1550 / 2,
    }
    # The CPX GPU's five unheld partitions and the unheld VFs and mdevs are idle.
    idle = dict(con.execute("SELECT model, sum(cost) FROM charges WHERE team = 'idle' "
                            "GROUP BY model").fetchall())
    # MI300X: 5 of 8 partitions; MxGPU GPU 0: VFs 2 and 3; GPU 1: VFs 1-3.
    assert idle == {"AMD Instinct MI300X": HOURS * mi300x * (D(5) / 8 + D(2) / 4 + D(3) / 4),
                    # SR-IOV: 2 of 4 VFs; tiles: tile 1 after hour 48
                    "Intel(R) Data Center GPU Max 1550":
                        HOURS * max1550 / 2 + (HOURS - 48) * max1550 / 2,
                    "Intel(R) UHD Graphics 630": HOURS * uhd * (1 - D(1) / 4 - D(1) / 8)}
    month = Month.parse("2026-10")
    recs = recommend(con, month.start, month.end, mig_fraction(cm), Settings())
    con.close()
    rightsized = [(r.owner_name, r.kind, r.proposed, r.saving) for r in recs
                  if r.kind is not Kind.IDLE]
    assert rightsized == [("embedder", Kind.TO_PARTITION, "AMD CPX partition (1 of 8)",
                           HOURS * mi300x * 7 / 8)]
    out = tmp_path / "report"
    assert report_cli.main(["--month", "2026-10", "--db", str(db), "--out", str(out),
                            "--format", "md,csv"]) == 0
    md = next(out.glob("*.md")).read_text()
    for text in ("AMD Instinct MI300X", "Intel(R) UHD Graphics 630",
                 "Intel(R) Data Center GPU Max 1550", "AMD CPX partition (1 of 8)"):
        assert text in md, text

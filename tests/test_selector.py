"""Billing integrity (issue 13): only the exporter's series are metered, through a selector whose
default matches the shipped deployment; look-alike series from elsewhere are reported."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from promtools import backfill, running_prometheus

from metering.cli_meter import main
from metering.selector import DEFAULT_SELECTOR, Matcher, Op, Selector, SelectorError

T0 = 1791158400  # 2026-10-05T00:00Z
H100 = "NVIDIA H100 80GB HBM3"


def test_default_matches_the_shipped_job_and_backfilled_history() -> None:
    """deploy/base: the headless Service gpu-ledger-exporter names the scrape job."""
    deploy = Path(__file__).resolve().parent.parent / "deploy" / "base" / \
        "exporter-service.yaml"
    assert "name: gpu-ledger-exporter" in deploy.read_text()
    assert DEFAULT_SELECTOR.matches({"job": "gpu-ledger-exporter", "instance": "a:9847"})
    assert DEFAULT_SELECTOR.matches({"node": "n"})  # promtool backfill: no job label
    assert not DEFAULT_SELECTOR.matches({"job": "kubernetes-pods"})
    assert not DEFAULT_SELECTOR.matches({"job": "gpu-ledger-exporter-evil"})  # anchored


def test_parse_render_and_complement() -> None:
    sel = Selector.parse(' {job="a\\"b", namespace=~"gpu-.*" ,cluster!="x"} ')
    assert sel.matchers == (Matcher("job", Op.EQ, 'a"b'), Matcher("namespace", Op.RE, "gpu-.*"),
                            Matcher("cluster", Op.NE, "x"))
    assert sel.promql() == 'job="a\\"b",namespace=~"gpu-.*",cluster!="x"'
    assert Selector.parse(sel.promql()) == sel
    assert [m.promql() for m in sel.complement()] == \
        ['job!="a\\"b"', 'namespace!~"gpu-.*"', 'cluster="x"']
    assert Selector.parse("").matchers == () and Selector.parse("").matches({"job": "z"})


@pytest.mark.parametrize("text", ['job="a" namespace="b"', "job=a", 'job=~"("', '1job="a"'])
def test_bad_selectors_are_one_line_errors(text: str) -> None:
    with pytest.raises(SelectorError) as exc:
        Selector.parse(text)
    assert "\n" not in str(exc.value)


def test_bad_selector_on_the_command_line_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--openmetrics", str(tmp_path / "x.om"), "--from", "2026-10-05T00:00", "--to",
               "2026-10-05T01:00", "--db", str(tmp_path / "m.duckdb"), "--selector", "job=a"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--selector" in err


def _series(name: str, labels: dict[str, str], value: float = 1.0) -> list[str]:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return [f"{name}{{{body}}} {value} {T0 + t}" for t in range(60, 3601, 60)]


def test_rogue_target_is_not_billed_and_is_reported(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 13 reproduced: a pod scraped through annotation discovery (job kubernetes-pods)
    publishes gpu_up/gpu_info for a GPU that does not exist and a gpu_container_allocation
    billing it to team `victim`. Hand-computed: the real GPU-1 is idle all hour (1 device-hour
    at the packaged H100 rate, on the idle row); `victim` pays nothing; the warning names the
    rogue job and instance."""
    exporter = {"job": "gpu-ledger-exporter", "instance": "10.0.0.1:9847"}
    rogue = {"job": "kubernetes-pods", "instance": "10.9.9.9:8080"}
    fake = {"node": "n1", "uuid": "GPU-FAKE"}
    lines = (_series("gpu_up", {"node": "n1", "gpu": "0", "uuid": "GPU-1", "model": H100,
                                **exporter})
             + _series("gpu_info", {"node": "n1", "uuid": "GPU-1", "mig_mode": "disabled",
                                    **exporter})
             + _series("gpu_up", {**fake, "gpu": "9", "model": H100, **rogue})
             + _series("gpu_info", {**fake, "mig_mode": "disabled", **rogue})
             + _series("gpu_container_allocation", {
                 **fake, "namespace": "x", "pod": "p", "container": "c", "mig_uuid": "",
                 "resource": "nvidia.com/gpu", "sharing": "exclusive", "replicas": "1",
                 "label_team": "victim", **rogue}))
    order = sorted(lines, key=lambda ln: (ln.split("{")[0], ln))
    text = ""
    last = ""
    for ln in order:
        name = ln.split("{")[0]
        if name != last:
            text += f"# TYPE {name} gauge\n"
            last = name
        text += ln + "\n"
    backfill(text + "# EOF\n", tmp_path / "prom")
    db = tmp_path / "m.duckdb"
    with running_prometheus(tmp_path / "prom") as url:
        rc = main(["--prometheus", url, "--from", "2026-10-05T00:00", "--to",
                   "2026-10-05T01:00", "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == 0, err
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT uuid FROM device_hours").fetchall() == [("GPU-1",)]
        assert con.execute("SELECT count(*) FROM allocation_hours").fetchone() == (0,)
        teams = {t for (t,) in con.execute("SELECT DISTINCT team FROM charges").fetchall()}
    finally:
        con.close()
    assert teams == {"idle"}
    assert "outside --selector {job=~\"gpu-ledger-exporter|\"}" in err
    for family in ("gpu_up", "gpu_info", "gpu_container_allocation"):
        assert f'{family} from job="kubernetes-pods" instance="10.9.9.9:8080" (1 series)' in err


def test_exporter_under_another_job_names_the_job_in_the_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Annotation-based scraping put every series under job kubernetes-pods: the default
    selector finds no GPU series; the one-line error says under which job they are."""
    labels = {"node": "n1", "gpu": "0", "uuid": "GPU-1", "model": H100,
              "job": "kubernetes-pods", "instance": "10.0.0.5:9847"}
    backfill("# TYPE gpu_up gauge\n" + "\n".join(_series("gpu_up", labels)) + "\n# EOF\n",
             tmp_path / "prom")
    with running_prometheus(tmp_path / "prom") as url:
        rc = main(["--prometheus", url, "--from", "2026-10-05T00:00", "--to",
                   "2026-10-05T01:00", "--db", str(tmp_path / "m.duckdb"), "-q"])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("\n") == 1
    assert 'outside the selector (--selector names the exporter\'s job): gpu_up from ' \
           'job="kubernetes-pods" instance="10.0.0.5:9847" (1 series)' in err

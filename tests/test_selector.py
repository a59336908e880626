"""Billing integrity (issue 13): only the exporter's series are metered, through a selector whose
default matches the shipped deployment; look-alike series from elsewhere are reported."""

from __future__ import annotations

from pathlib import Path

import conftest_prom
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


fleet_om_file = conftest_prom.fleet_om_file
DAY = ["--from", "2026-10-05", "--to", "2026-10-06"]


def _nodes_and_clusters(db: Path) -> list[tuple[str, str]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT DISTINCT node, cluster FROM device_hours ORDER BY ALL"
                           ).fetchall()
    finally:
        con.close()


def test_selector_and_cluster_from_the_environment(
        fleet_om_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """What the CronJob's ConfigMap sets (docs/operations.md, "Metering options"): the
    variables are the defaults of --selector and --cluster; the command line wins; an empty
    variable is unset; `{}` selects every series."""
    monkeypatch.setenv("GPU_LEDGER_SELECTOR", 'node="node-a"')
    monkeypatch.setenv("GPU_LEDGER_CLUSTER", "eu-west")
    db = tmp_path / "env.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db)]) == 0
    err = capsys.readouterr().err
    assert 'meter: --selector node="node-a" (from $GPU_LEDGER_SELECTOR)' in err
    assert "meter: --cluster eu-west (from $GPU_LEDGER_CLUSTER)" in err
    assert _nodes_and_clusters(db) == [("node-a", "eu-west")]

    db = tmp_path / "cli.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q",
                 "--selector", 'node="node-b"', "--cluster", "us-east"]) == 0
    assert _nodes_and_clusters(db) == [("node-b", "us-east")]

    monkeypatch.setenv("GPU_LEDGER_SELECTOR", " ")
    monkeypatch.setenv("GPU_LEDGER_CLUSTER", "")
    db = tmp_path / "empty.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    assert _nodes_and_clusters(db) == [("node-a", "default"), ("node-b", "default")]

    monkeypatch.setenv("GPU_LEDGER_SELECTOR", "{}")
    db = tmp_path / "all.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    assert _nodes_and_clusters(db) == [("node-a", "default"), ("node-b", "default")]


@pytest.mark.parametrize(("var", "value", "option"), [
    ("GPU_LEDGER_SELECTOR", "job=a", "--selector"),
    ("GPU_LEDGER_CLUSTER", "eu/west", "--cluster"),
    ("GPU_LEDGER_CLUSTER_LABEL", "1cluster", "--cluster-label"),
])
def test_a_bad_value_from_the_environment_names_its_variable(
        fleet_om_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], var: str, value: str, option: str) -> None:
    monkeypatch.setenv(var, value)
    db = tmp_path / "m.duckdb"
    rc = main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert f"{option} (from ${var}):" in err and not db.exists()


def test_price_only_ignores_the_source_variables(
        fleet_om_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A CronJob pod with a cluster label set can still re-price by hand: --price-only reads
    no series, so $GPU_LEDGER_CLUSTER_LABEL (and the others) do not apply to it."""
    db = tmp_path / "m.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    monkeypatch.setenv("GPU_LEDGER_CLUSTER_LABEL", "cluster")
    monkeypatch.setenv("GPU_LEDGER_CLUSTER", "eu-west")
    assert main(["--price-only", *DAY, "--db", str(db), "-q"]) == 0, capsys.readouterr().err

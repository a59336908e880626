"""Named SQL sections: steps in file order, queries by name, duplicates refused."""

from __future__ import annotations

import pytest

from metering import sqlfile


def test_steps_keep_the_file_order_and_queries_are_apart() -> None:
    f = sqlfile.parse("x.sql", "-- header\n-- step: b\nSELECT 2;\n-- query: q\nSELECT 9;\n"
                               "-- step: a\nSELECT 1;\n")
    assert f.steps == (("b", "SELECT 2;"), ("a", "SELECT 1;"))
    assert f.query("q") == "SELECT 9;"


def test_a_section_twice_is_refused() -> None:
    with pytest.raises(ValueError, match=r"x\.sql: section 'a' appears twice"):
        sqlfile.parse("x.sql", "-- step: a\nSELECT 1;\n-- query: a\nSELECT 2;\n")


def test_the_packaged_files_parse() -> None:
    facts = sqlfile.load("facts.sql")
    assert [name for name, _ in facts.steps] == [
        "macros", "spans", "held", "device_hours", "mig_hours", "allocation_hours",
        "workload_hours", "grant_hours"]
    pricing = sqlfile.load("pricing.sql")
    names = [name for name, _ in pricing.steps]
    assert names[:2] == ["macros", "devices"] and names[-4:] == [
        "energy_delete", "energy_devices", "energy_holders", "energy_insert"]
    assert set(pricing.queries) == {"totals", "orphans", "holders_unique", "waste_rows"}
    report = sqlfile.load("report.sql")
    assert report.steps == ()
    assert {"sections", "capacity_hours", "charge_days"} <= set(report.queries)
    waste = sqlfile.load("waste.sql")
    assert waste.steps == () and set(waste.queries) == {"device_hours", "p95", "workloads"}

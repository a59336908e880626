"""The default cost model's allocation pricing done in pandas, for comparison with the SQL
engine (metering/sql/pricing.sql): basis allocation, MIG by compute slices, time-slicing by
1/replicas, idle kept separate, no discounts or tiers. Money in integer micros, floored per
row, as the engine does; returns per-team totals plus idle and down."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from metering.costmodel import MICRO, CostModel

DEVICE_COLS = "hour, uuid, model, up_seconds"
ALLOC_COLS = ("hour, namespace, uuid, mig_uuid, replicas, units, allocated_seconds, "
              "coalesce(labels[$label], '') AS label_team")
MIG_COLS = "hour, mig_uuid, slices, parent_slices"


def load(con: Any, model: CostModel, start: datetime, end: datetime
         ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    period = {"start": start, "end": end}
    where = "WHERE hour >= $start AND hour < $end"
    dev = con.execute(f"SELECT {DEVICE_COLS} FROM device_hours {where}", period).df()
    alloc = con.execute(f"SELECT {ALLOC_COLS} FROM allocation_hours {where}",
                        {**period, "label": model.team_label}).df()
    mig = con.execute(f"SELECT {MIG_COLS} FROM mig_hours {where}", period).df()
    return dev, alloc, mig


def price(model: CostModel, dev: pd.DataFrame, alloc: pd.DataFrame, mig: pd.DataFrame
          ) -> dict[str, int]:
    """Team -> micros charged, plus 'idle' and 'down'."""
    rates = {m: int(model.price_for(m).hourly / MICRO) for m in dev["model"].unique()}
    dev = dev.assign(rate=dev["model"].map(rates).astype(np.int64))
    dev["up_frac"] = dev["up_seconds"].clip(0, 3600) / 3600.0
    dev["avail"] = np.floor(dev["rate"] * dev["up_frac"]).astype(np.int64)

    a = alloc.merge(dev[["hour", "uuid", "rate", "up_frac"]], on=["hour", "uuid"], how="inner")
    a = a.merge(mig, on=["hour", "mig_uuid"], how="left")
    teams = {ns: model.team_for_namespace(ns) for ns in a["namespace"].unique()}
    a["team"] = a["label_team"].where(a["label_team"] != "", a["namespace"].map(teams))
    held = np.minimum(a["allocated_seconds"].clip(lower=0), 3600 * a["up_frac"]) / 3600.0
    share = np.minimum(a["units"].clip(lower=0) / a["replicas"].clip(lower=1), 1.0)
    is_mig = a["mig_uuid"] != ""
    mig_frac = np.where(is_mig, np.minimum(
        a["slices"].fillna(1) / a["parent_slices"].fillna(7).clip(lower=1), 1.0), 1.0)
    a["hours"] = mig_frac * share * held
    # never charge more of a device-hour than it was up
    claimed = a.groupby(["hour", "uuid"], sort=False)["hours"].transform("sum")
    scale = np.where(claimed > a["up_frac"], a["up_frac"] / claimed, 1.0)
    a["micros"] = np.floor(a["rate"] * (a["hours"] * scale)).astype(np.int64)

    out = {str(k): int(v) for k, v in a.groupby("team", sort=False)["micros"].sum().items()}
    used = a.groupby(["hour", "uuid"], sort=False)["micros"].sum()
    dev = dev.set_index(["hour", "uuid"])
    dev["used"] = used.reindex(dev.index, fill_value=0)
    out["idle"] = int((dev["avail"] - dev["used"]).sum())
    out["down"] = int((dev["rate"] - dev["avail"]).sum())
    return out

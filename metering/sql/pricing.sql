-- GPU Ledger pricing: facts of cluster gl_cluster for [gl_start, gl_end) -> `charges`. Run by
-- metering/pricing.py inside one transaction, once per cluster and slice of the period: every
-- `-- step:` section in file order, then the `-- query:` sections it reads the totals from.
-- A cluster is priced on its own (its own prices, team rules and idle pools): no statement
-- here looks at another cluster's rows.
--
-- The cost model arrives as session variables (getvariable('gl_*')) and small temp tables that
-- pricing.py fills from the resolved cost model: _p_models (price per GPU model), _p_ns (team
-- per namespace), _p_team_disc, _p_mig_table, _p_vgpu_table, _p_eff, _p_tiers, _p_idle_weights,
-- _p_energy (per hour: price of a kWh and gCO2e per kWh, in integer millionths / thousandths).
--
-- Money is integer millionths of the currency ("micros") until the final INSERT, so that
--   fleet cost = down + charged list amounts + idle      (per device-hour, exactly)
-- and every later step (discounts, sharing idle out) moves micros around without losing any.

-- step: macros
-- An Intel GVT-g mdev type named at the end of a vGPU's resource (intel.com/i915-GVTg_V5_4):
-- type "N" is scheduled with weight 16/N of 16 (drivers/gpu/drm/i915/gvt/vgpu.c,
-- intel_vgpu_configs), so it costs 1/N of the GPU. NULL for any other resource.
CREATE OR REPLACE TEMP MACRO gl_mdev_share(resource) AS
    1.0 / nullif(TRY_CAST(nullif(regexp_extract(resource, 'GVTg_V\d+_(\d+)$', 1), '')
                          AS INTEGER), 0);

-- step: devices
-- One row per device-hour with its list price. Fleet cost of a device-hour = rate_micros:
-- the fleet owns the GPU for the whole hour, up or not. Only up time can be charged.
CREATE OR REPLACE TEMP TABLE _dev AS
SELECT d.hour, d.node, d.uuid, d.model,
       m.rate_micros,
       m.model_discount,
       m.memory_gb,
       least(greatest(d.up_seconds, 0), 3600) / 3600.0 AS up_frac,
       floor(m.rate_micros * least(greatest(d.up_seconds, 0), 3600) / 3600.0)::BIGINT
           AS avail_micros,
       d.energy_joules, d.energy_estimated
FROM device_hours d
JOIN _p_models m ON m.model = d.model
WHERE d.hour >= getvariable('gl_start') AND d.hour < getvariable('gl_end')
  AND d.cluster = getvariable('gl_cluster') AND m.vendor = d.vendor;

-- step: alloc
-- One row per allocation fact (hour x container x device or MIG instance) with everything that
-- does not depend on the other holders of the device: team, share, usage, multiplier.
CREATE OR REPLACE TEMP TABLE _alloc AS
WITH a AS (
    SELECT a.hour, a.namespace, a.pod, a.container, a.uuid, a.mig_uuid, a.sharing,
           d.node, d.model, d.rate_micros, d.model_discount, d.up_frac,
           coalesce(nullif(a.labels[getvariable('gl_label')], ''), ns.team,
                    getvariable('gl_default_team')) AS team,
           -- device time held while the GPU was up: a GPU that is down cannot be used.
           least(greatest(a.allocated_seconds, 0), 3600 * d.up_frac) / 3600.0 AS held_hours,
           -- the share of the device (or MIG instance) held: a vGPU type's vgpu.table
           -- fraction, else a GVT-g type's 1/N; a fractional grant's or vGPU's fraction
           -- (sharing.fractional picks memory, cores or the larger, the other figure when the
           -- picked one is absent; a vGPU, SR-IOV VF or mdev has its framebuffer share); else
           -- units of replicas: 2 of 4 replicas = 2/4 (a VF of 4 enabled = 1/4).
           CASE WHEN vt.fraction IS NOT NULL THEN least(greatest(vt.fraction, 0), 1.0)
                WHEN a.sharing = 'vgpu' AND gl_mdev_share(a.resource) IS NOT NULL
                    THEN least(gl_mdev_share(a.resource), 1.0)
                WHEN gr.fraction IS NOT NULL THEN least(greatest(gr.fraction, 0), 1.0)
                ELSE least(greatest(a.units, 0) / greatest(a.replicas, 1), 1.0) END AS share,
           -- a priced grant or type is not split by use with the device's other holders
           gr.fraction IS NULL AND vt.fraction IS NULL AND greatest(a.replicas, 1) > 1
               AND NOT (a.sharing = 'vgpu' AND gl_mdev_share(a.resource) IS NOT NULL)
               AS shared,
           a.mig_uuid <> '' AS is_mig,
           CASE getvariable('gl_split') WHEN 'memory' THEN greatest(a.memory_byte_seconds, 0)
                WHEN 'sm' THEN greatest(coalesce(a.sm_seconds, 0), 0) ELSE 0 END AS split_w,
           -- NULL stays NULL (greatest() would skip it and give 0): unknown is not idle.
           CASE WHEN a.sm_seconds IS NOT NULL THEN greatest(a.sm_seconds, 0) END AS sm_seconds,
           CASE WHEN mh.sm_active_seconds IS NOT NULL THEN greatest(mh.sm_active_seconds, 0)
           END AS gpm_seconds,
           -- MIG profile and slices from the MIG facts, else from a mixed-strategy resource
           -- name (nvidia.com/mig-3g.40gb) with 7 parent slices (A100, H100, H200), or an
           -- AMD partition's (amd.com/cpx_nps4): one of its mode's partitions.
           CASE WHEN a.mig_uuid = '' THEN ''
                ELSE coalesce(mh.profile,
                              nullif(regexp_extract(a.resource, 'mig-(\d+g\.\d+gb)', 1), ''),
                              nullif(regexp_extract(
                                  a.resource, '^amd\.com/((spx|dpx|tpx|qpx|cpx)(_nps\d)?)$', 1),
                                  ''),
                              '') END AS profile,
           coalesce(mh.slices,
                    TRY_CAST(nullif(regexp_extract(a.resource, 'mig-(\d+)g\.', 1), '')
                             AS INTEGER),
                    CASE WHEN pp.parts IS NOT NULL THEN 1 END) AS slices,
           coalesce(mh.parent_slices, pp.parts, 7) AS parent_slices,
           d.memory_gb,
           -- as waste.sql `device_hours` reads them (step waste_rows)
           least(a.allocated_seconds, 3600) AS waste_held_s, a.sm_seconds AS waste_sm_s,
           coalesce(mh.profile, '') AS waste_profile,
           mh.sm_active_seconds / nullif(mh.observed_seconds, 0) AS waste_inst_sm
    FROM allocation_hours a
    JOIN _dev d ON d.hour = a.hour AND d.uuid = a.uuid
    LEFT JOIN _p_ns ns ON ns.namespace = a.namespace
    LEFT JOIN mig_hours mh
           ON a.mig_uuid <> '' AND mh.hour = a.hour AND mh.mig_uuid = a.mig_uuid
          AND mh.cluster = getvariable('gl_cluster')
    LEFT JOIN (
        SELECT hour, namespace, pod, container, uuid, mig_uuid,
               CASE getvariable('gl_fractional')
                    WHEN 'memory' THEN coalesce(memory_fraction, core_fraction)
                    WHEN 'cores' THEN coalesce(core_fraction, memory_fraction)
                    -- greatest() skips a NULL: the larger of the figures there are
                    ELSE greatest(memory_fraction, core_fraction) END AS fraction
        FROM grant_hours
        WHERE hour >= getvariable('gl_start') AND hour < getvariable('gl_end')
          AND cluster = getvariable('gl_cluster')
    ) gr ON a.sharing IN ('fractional', 'vgpu') AND gr.hour = a.hour
        AND gr.namespace = a.namespace
        AND gr.pod = a.pod AND gr.container = a.container AND gr.uuid = a.uuid
        AND gr.mig_uuid = a.mig_uuid
    -- an AMD partition held by resource name only (no partition facts): its mode's count
    -- (_p_partitions: per AMD model of the period and mode, from metering/partitions.py)
    LEFT JOIN _p_partitions pp
           ON a.mig_uuid <> '' AND mh.mig_uuid IS NULL AND pp.model = d.model
          AND pp.mode = regexp_extract(a.resource, '^amd\.com/(spx|dpx|tpx|qpx|cpx)(_nps\d)?$', 1)
    -- a vGPU's type is its resource name after the vendor: nvidia.com/NVIDIA_A100-4C
    LEFT JOIN _p_vgpu_table vt
           ON a.sharing = 'vgpu' AND vt.profile = regexp_extract(a.resource, '[^/]+$')
    WHERE a.hour >= getvariable('gl_start') AND a.hour < getvariable('gl_end')
      AND a.cluster = getvariable('gl_cluster')
), f AS (
    SELECT a.*,
           CASE WHEN NOT a.is_mig THEN 1.0
                WHEN getvariable('gl_mig_fraction') = 'table' AND t.fraction IS NOT NULL
                    THEN t.fraction
                WHEN getvariable('gl_mig_fraction') = 'memory' AND a.memory_gb > 0
                     AND regexp_matches(a.profile, '^\d+g\.\d+gb')
                    THEN least(TRY_CAST(regexp_extract(a.profile, '^\d+g\.(\d+)gb', 1)
                                        AS DOUBLE) / a.memory_gb, 1.0)
                -- unknown profile: one slice, the least an instance can be
                ELSE least(coalesce(a.slices, 1) / greatest(a.parent_slices, 1), 1.0)
           END AS mig_frac
    FROM a
    LEFT JOIN _p_mig_table t ON a.is_mig AND t.profile = a.profile
), inst AS (
    -- each MIG instance's holding in the hour (a grouped sum: a window over every row cost
    -- more than the rest of this step)
    SELECT hour, uuid, mig_uuid, sum(share * held_hours) AS held
    FROM f WHERE is_mig GROUP BY hour, uuid, mig_uuid
), g AS (
    SELECT f.*,
           -- the instance's SM capacity in device-equivalents: physical slices, whatever
           -- mig.fraction prices it at (used GPU-hours measure activity, not money).
           CASE WHEN is_mig THEN least(coalesce(slices, 1) / greatest(parent_slices, 1), 1.0)
                ELSE 1.0 END AS slice_frac,
           -- this container's part of the instance's holding in the hour (several containers
           -- may share an instance, in turn or as replicas): GPM measures the instance.
           f.share * f.held_hours / nullif(i.held, 0) AS inst_part
    FROM f
    LEFT JOIN inst i ON f.is_mig AND i.hour = f.hour AND i.uuid = f.uuid
                    AND i.mig_uuid = f.mig_uuid
), al AS (
    SELECT g.*,
           mig_frac * share * held_hours AS alloc_hours,
           -- device-equivalent hours of SM activity: the container's own figure, else on MIG
           -- its part of the instance's GPM activity; NULL (unknown) when neither exists.
           CASE WHEN sm_seconds IS NOT NULL
                    THEN least(sm_seconds / 3600.0, slice_frac * held_hours)
                WHEN is_mig AND gpm_seconds IS NOT NULL
                    THEN least(gpm_seconds / 3600.0 * slice_frac * coalesce(inst_part, 0),
                               slice_frac * held_hours)
           END AS used_hours
    FROM g
), u AS (
    SELECT al.*,
           CASE WHEN used_hours IS NULL OR alloc_hours <= 0 THEN NULL
                ELSE least(used_hours / alloc_hours, 1.0) END AS util
    FROM al
)
SELECT u.hour, u.team, u.namespace, u.pod, u.container, u.node, u.uuid, u.mig_uuid, u.model,
       u.sharing, u.profile, u.shared, u.up_frac, u.rate_micros, u.split_w, u.alloc_hours,
       u.used_hours,
       coalesce(t.multiplier, 1.0) * coalesce(e.factor, 1.0)
           * (1 - coalesce(td.discount, 0)) * (1 - u.model_discount) AS mult,
       u.is_mig,
       -- the holder's claim on the device-hour's measured energy, in device-hours (step
       -- energy_insert): exclusive, all of the time it held; MIG, its instance's GPM activity
       -- in device-equivalents, else its slices' share of the time held; time-slicing, MPS,
       -- fractional, vGPU, its SM activity (as the usage split measures it), else its held
       -- share. Summed per device-hour in _idle.
       CASE WHEN u.is_mig THEN coalesce(u.used_hours, u.slice_frac * u.share * u.held_hours)
            WHEN u.sharing = 'exclusive' THEN u.alloc_hours
            ELSE coalesce(u.used_hours, u.alloc_hours) END AS energy_claim,
       u.waste_held_s, u.waste_sm_s, u.waste_profile, u.waste_inst_sm
FROM u
LEFT JOIN _p_tiers t ON u.util > t.lo AND u.util <= t.hi
LEFT JOIN _p_eff e ON e.sharing = u.sharing
LEFT JOIN _p_team_disc td ON td.team = u.team;

-- step: rows
-- Charge per allocation row: the basis applied, shared devices split, over-claims scaled.
CREATE OR REPLACE TEMP TABLE _rows AS
WITH inst AS (
    -- Usage-weighted split of a shared device's held shares: the holders together pay for
    -- what they held, divided by memory or SM use. Unheld shares stay idle.
    SELECT hour, uuid, mig_uuid, sum(alloc_hours) AS held, sum(split_w) AS w
    FROM _alloc
    WHERE shared AND getvariable('gl_split') <> 'replicas'
    GROUP BY hour, uuid, mig_uuid
), sp AS (
    SELECT a.*, a.rowid AS aid,
           CASE WHEN i.w > 0 THEN i.held * a.split_w / i.w ELSE a.alloc_hours END AS split_hours
    FROM _alloc a
    LEFT JOIN inst i ON a.shared AND i.hour = a.hour AND i.uuid = a.uuid
                     AND i.mig_uuid = a.mig_uuid
), b AS (
    SELECT sp.*,
           CASE getvariable('gl_basis')
                WHEN 'allocation' THEN split_hours
                WHEN 'usage' THEN coalesce(used_hours, split_hours)
                ELSE coalesce((1 - getvariable('gl_usage_weight')) * split_hours
                              + getvariable('gl_usage_weight') * used_hours, split_hours)
           END AS charge_hours,
           CASE WHEN getvariable('gl_basis') = 'allocation' THEN 'allocation'
                WHEN used_hours IS NULL AND mig_uuid <> '' THEN 'allocation (no SM data on MIG)'
                WHEN used_hours IS NULL THEN 'allocation (no SM data)'
                ELSE getvariable('gl_basis') END AS basis
    FROM sp
), dev AS (
    -- Never charge more of a device than it was up: scale a device's rows down when the facts
    -- claim more (overlapping pods in one hour, more shares than replicas). And the devices
    -- held by more than one row (step waste_rows groups only their rows).
    SELECT hour, uuid,
           CASE WHEN sum(charge_hours) > any_value(up_frac)
                THEN any_value(up_frac) / sum(charge_hours) END AS scale,
           count(*) AS holders
    FROM b GROUP BY hour, uuid
    HAVING sum(charge_hours) > any_value(up_frac) OR count(*) > 1
), sc AS (
    SELECT b.*, charge_hours * coalesce(dev.scale, 1.0) AS fraction,
           coalesce(dev.holders, 1) AS device_holders
    FROM b LEFT JOIN dev USING (hour, uuid)
)
SELECT hour, team, namespace, pod, container, node, uuid, mig_uuid, model, sharing, profile,
       basis, fraction,
       rate_micros * mult / 1e6 AS rate,
       alloc_hours AS allocated_gpu_hours,
       used_hours AS used_gpu_hours,  -- NULL: unknown, reports say so instead of 0%
       floor(rate_micros * fraction)::BIGINT AS list_micros,
       floor(rate_micros * fraction * mult)::BIGINT AS final_micros,
       hash(namespace, pod, container, uuid, mig_uuid) AS row_key,
       energy_claim,
       aid,  -- its _alloc row (rowid)
       device_holders  -- rows of the device-hour
FROM sc;

-- step: idle
-- Per device-hour: down time (never charged to a team) and idle (up, but nobody held it);
-- its measured energy and its holders' energy claims (NULL: no holder), for energy_insert.
CREATE OR REPLACE TEMP TABLE _idle AS
SELECT d.hour, d.node, d.uuid, d.model, d.rate_micros, d.up_frac,
       d.rate_micros - d.avail_micros AS down_micros,
       d.avail_micros - coalesce(s.list_micros, 0) AS idle_micros,
       d.energy_joules, d.energy_estimated, s.claims
FROM _dev d
LEFT JOIN (SELECT hour, uuid, sum(list_micros)::BIGINT AS list_micros,
                  sum(greatest(energy_claim, 0)) AS claims
           FROM _rows GROUP BY hour, uuid) s USING (hour, uuid);

-- step: pools
-- Idle cost per hour x GPU model, and what the team rows there can absorb.
CREATE OR REPLACE TEMP TABLE _pool AS
SELECT i.hour, i.model, sum(i.idle_micros)::BIGINT AS pool,
       coalesce(any_value(r.n_rows), 0) AS n_rows
FROM _idle i
LEFT JOIN (SELECT hour, model, count(*) AS n_rows FROM _rows GROUP BY hour, model) r
       USING (hour, model)
GROUP BY i.hour, i.model;

-- step: shares
-- Idle shared out to team rows (policy proportional or even). Each row gets floor(pool x w);
-- the few micros left over go to the row with the largest weight, so shares sum to the pool.
CREATE OR REPLACE TEMP TABLE _share AS
WITH tt AS (
    SELECT hour, model, team, sum(final_micros) AS team_final, count(*) AS team_rows
    FROM _rows GROUP BY hour, model, team
), pt AS (
    SELECT hour, model, sum(team_final) AS total_final, count(*) AS n_teams,
           sum(team_rows) AS total_rows
    FROM tt GROUP BY hour, model
), w AS (
    SELECT r.rowid AS rid, r.hour, r.model, r.row_key, p.pool,
           CASE getvariable('gl_idle_policy')
               WHEN 'proportional' THEN
                   CASE WHEN pt.total_final > 0 THEN r.final_micros / pt.total_final
                        ELSE 1.0 / pt.total_rows END
               ELSE (1.0 / pt.n_teams)
                   * CASE WHEN tt.team_final > 0 THEN r.final_micros / tt.team_final
                          ELSE 1.0 / tt.team_rows END
           END AS w
    FROM _rows r
    JOIN _pool p USING (hour, model)
    JOIN pt USING (hour, model)
    JOIN tt USING (hour, model, team)
    WHERE getvariable('gl_idle_policy') IN ('proportional', 'even') AND p.pool <> 0
), s AS (
    SELECT *, floor(pool * w)::BIGINT AS share FROM w
), top AS (
    SELECT hour, model, any_value(pool) - sum(share) AS resid,
           arg_max(rid, {'w': w, 'k': row_key}) AS top_rid
    FROM s GROUP BY hour, model
)
SELECT s.rid, s.share + CASE WHEN s.rid = top.top_rid THEN top.resid ELSE 0 END AS share
FROM s JOIN top USING (hour, model);

-- step: delete
DELETE FROM charges WHERE hour >= getvariable('gl_start') AND hour < getvariable('gl_end')
  AND cluster = getvariable('gl_cluster');

-- step: insert_charge_rows
-- Every charge row of the slice in one INSERT: the holders' rows, idle, the policy weights'
-- idle shares, down and adjustment rows. Five INSERTs, one per kind, wrote the same rows in
-- 1.00-1.11x the time (the 10,000-GPU month's pricing; docs/performance.md, "One charges
-- insert per slice").
INSERT INTO charges (hour, team, namespace, pod, container, node, uuid, mig_uuid, model, sharing,
                     profile, basis, fraction, rate, allocated_gpu_hours, used_gpu_hours, cost,
                     idle_share, cost_model_hash, cluster)
WITH weighted AS (
    -- Policy weights: each listed team pays its fixed share of every hour x model's idle pool.
    SELECT p.hour, p.model, w.team, w.weight, p.pool,
           floor(p.pool * w.weight)::BIGINT AS share,
           row_number() OVER (PARTITION BY p.hour, p.model
                              ORDER BY w.weight DESC, w.team) AS rn
    FROM _pool p CROSS JOIN _p_idle_weights w
    WHERE getvariable('gl_idle_policy') = 'weights' AND p.pool <> 0
), weighted_rows AS (
    SELECT *, share + CASE WHEN rn = 1 THEN pool - sum(share) OVER (PARTITION BY hour, model)
                           ELSE 0 END AS amount
    FROM weighted
)
-- the holders' rows, with their share of the idle pool
SELECT r.hour, r.team, r.namespace, r.pod, r.container, r.node, r.uuid, r.mig_uuid, r.model,
       r.sharing, r.profile, r.basis, r.fraction, r.rate, r.allocated_gpu_hours,
       r.used_gpu_hours,
       gl_money(r.final_micros + coalesce(s.share, 0)),
       gl_money(coalesce(s.share, 0)),
       getvariable('gl_hash'), getvariable('gl_cluster')
FROM _rows r
LEFT JOIN _share s ON s.rid = r.rowid
UNION ALL
-- Idle stays with the platform under policy separate, and wherever no team used that model in
-- that hour (nobody to share it with).
SELECT i.hour, 'idle', '', '', '', i.node, i.uuid, '', i.model, 'idle', '', 'idle',
       i.idle_micros / i.rate_micros, i.rate_micros / 1e6, 0, 0,
       gl_money(i.idle_micros), gl_money(0), getvariable('gl_hash'), getvariable('gl_cluster')
FROM _idle i
JOIN _pool p USING (hour, model)
WHERE i.idle_micros <> 0
  AND (getvariable('gl_idle_policy') = 'separate'
       OR (getvariable('gl_idle_policy') IN ('proportional', 'even') AND p.n_rows = 0))
UNION ALL
-- the policy weights' idle shares
SELECT hour, team, '', '', '', '', '', '', model, 'idle', '', 'idle-share', weight, 0, 0, 0,
       gl_money(amount), gl_money(amount), getvariable('gl_hash'), getvariable('gl_cluster')
FROM weighted_rows WHERE amount <> 0
UNION ALL
-- A GPU that was down (gpu_up 0, or not seen) is the fleet's cost, never a team's.
SELECT hour, 'down', '', '', '', node, uuid, '', model, 'down', '', 'down', 1 - up_frac,
       rate_micros / 1e6, 0, 0, gl_money(down_micros), gl_money(0), getvariable('gl_hash'),
       getvariable('gl_cluster')
FROM _idle WHERE down_micros <> 0
UNION ALL
-- What discounts, utilisation tiers and sharing-efficiency factors took off (or added to) the
-- list price, per hour x model, so charges still add up to the fleet cost.
SELECT hour, 'adjustment', '', '', '', '', '', '', model, 'adjustment', '', 'adjustment', 0, 0,
       0, 0, gl_money(sum(list_micros - final_micros)), gl_money(0), getvariable('gl_hash'),
       getvariable('gl_cluster')
FROM _rows GROUP BY hour, model
HAVING sum(list_micros - final_micros) <> 0;

-- step: energy_delete
DELETE FROM energy_hours WHERE hour >= getvariable('gl_start') AND hour < getvariable('gl_end')
  AND cluster = getvariable('gl_cluster');

-- step: energy_devices
-- Each device-hour's measured energy split among its holders (docs/cost-model.md, "Energy and
-- carbon"), by their energy_claim (step alloc) summed per device-hour in _idle: a device whose
-- holders claim more than its up time is scaled down to it. Only device-hours with a measured
-- energy are read. Joules in integer millijoules, money in micros, CO2e in milligrams: each
-- holder gets the floor of its share, `down` the floor of the hour's down time, `idle` exactly
-- what is left, so the rows of a device-hour add up to its energy, cost and CO2e with nothing
-- lost. This view: the device-hours with their energy's cost and CO2e.
CREATE OR REPLACE TEMP VIEW _etot AS
WITH dv AS (
    SELECT i.hour, i.node, i.uuid, i.model, i.up_frac, i.energy_estimated AS est, i.claims,
           CAST(round(greatest(i.energy_joules, 0) * 1000) AS BIGINT) AS mj,
           pe.price_u, pe.pue_u, pe.gpk_m
    FROM _idle i JOIN _p_energy pe USING (hour)
    WHERE i.energy_joules IS NOT NULL AND isfinite(i.energy_joules)
)
-- a kWh is 3.6e9 mJ; PUE and price in millionths, intensity in thousandths: cost in micros
-- and CO2e in milligrams are the product / 3.6e15, rounded half up
SELECT dv.*,
       (CAST(mj AS HUGEINT) * pue_u * price_u + 1800000000000000) // 3600000000000000
           AS cost_u,
       (CAST(mj AS HUGEINT) * pue_u * gpk_m + 1800000000000000) // 3600000000000000 AS co2_mg
FROM dv;

-- step: energy_holders
-- Each holder's share of its device-hour's energy, per _alloc row (aid: its rowid). Only the
-- figures: the row's names are _alloc's (a materialised copy of _alloc per slice raised
-- pricing's peak memory by more than half). Read by energy_insert and by waste_rows.
CREATE OR REPLACE TEMP TABLE _eheld AS
WITH eshare AS (
    SELECT a.rowid AS aid, a.hour, a.uuid,
           greatest(a.energy_claim, 0)
               * CASE WHEN t.claims > a.up_frac THEN a.up_frac / t.claims ELSE 1 END AS w,
           t.est, t.price_u, t.mj AS dev_mj, t.cost_u AS dev_cost, t.co2_mg AS dev_co2
    FROM _alloc a JOIN _etot t USING (hour, uuid)
), held AS (
    SELECT *, CAST(floor(dev_mj * w) AS BIGINT) AS mj_row FROM eshare
)
-- (0 J: 0, or NULL where not priced)
SELECT aid, hour, uuid, w, est, price_u, mj_row,
       CASE WHEN dev_mj > 0 THEN CAST(dev_cost * mj_row AS HUGEINT) // dev_mj
            ELSE dev_cost * 0 END AS cost_row,
       CASE WHEN dev_mj > 0 THEN CAST(dev_co2 * mj_row AS HUGEINT) // dev_mj
            ELSE dev_co2 * 0 END AS co2_row
FROM held;

-- step: energy_insert
INSERT INTO energy_hours (hour, team, namespace, pod, container, node, uuid, mig_uuid, model,
                          sharing, profile, rule, fraction, energy_joules, estimated,
                          price_per_kwh, energy_cost, co2e_grams, cost_model_hash, cluster)
WITH holders AS (
    SELECT e.hour, a.team, a.namespace, a.pod, a.container, a.node, e.uuid, a.mig_uuid,
           a.model, a.sharing, a.profile,
           CASE WHEN a.is_mig AND a.used_hours IS NOT NULL THEN 'mig-activity'
                WHEN a.is_mig THEN 'mig-slices'
                WHEN a.sharing = 'exclusive' THEN 'held'
                WHEN a.used_hours IS NOT NULL THEN 'sm-share'
                ELSE 'held (no SM data)' END AS rule,
           e.w, e.est, e.price_u, e.mj_row, e.cost_row, e.co2_row
    FROM _eheld e JOIN _alloc a ON a.rowid = e.aid
), hs AS (
    SELECT hour, uuid, sum(mj_row) AS mj_held, sum(cost_row) AS cost_held,
           sum(co2_row) AS co2_held
    FROM _eheld GROUP BY hour, uuid
), down AS (
    SELECT t.*, CAST(floor(t.mj * (1 - t.up_frac)) AS BIGINT) AS mj_down FROM _etot t
), fleet AS (
    SELECT d.*,
           CASE WHEN d.mj > 0 THEN d.cost_u * d.mj_down // d.mj END AS cost_down,
           CASE WHEN d.mj > 0 THEN d.co2_mg * d.mj_down // d.mj END AS co2_down,
           coalesce(h.mj_held, 0) AS mj_held, coalesce(h.cost_held, 0) AS cost_held,
           coalesce(h.co2_held, 0) AS co2_held
    FROM down d LEFT JOIN hs h USING (hour, uuid)
), erows AS (
    SELECT hour, team, namespace, pod, container, node, uuid, mig_uuid, model, sharing,
           profile, rule, w AS fraction, mj_row AS mj, est, price_u, cost_row AS cost_u,
           co2_row AS co2_mg
    FROM holders
    UNION ALL
    SELECT hour, 'down', '', '', '', node, uuid, '', model, 'down', '', 'down', 1 - up_frac,
           mj_down, est, price_u, cost_down, co2_down
    FROM fleet WHERE mj_down <> 0
    UNION ALL
    SELECT hour, 'idle', '', '', '', node, uuid, '', model, 'idle', '', 'idle',
           CASE WHEN mj > 0 THEN (mj - mj_down - mj_held) / mj ELSE 0 END,
           mj - mj_down - mj_held, est, price_u, cost_u - coalesce(cost_down, 0) - cost_held,
           co2_mg - coalesce(co2_down, 0) - co2_held
    FROM fleet
    -- any remainder of the three: a holder's floors can leave CO2e over with no joules left
    WHERE mj - mj_down - mj_held <> 0 OR cost_u - coalesce(cost_down, 0) - cost_held <> 0
       OR co2_mg - coalesce(co2_down, 0) - co2_held <> 0
)
SELECT hour, team, namespace, pod, container, node, uuid, mig_uuid, model, sharing, profile,
       rule, fraction, gl_milli(mj), est, gl_money(price_u), gl_money(cost_u), gl_milli(co2_mg),
       getvariable('gl_hash'), getvariable('gl_cluster')
FROM erows;

-- query: totals
SELECT
    (SELECT count(DISTINCT hour) FROM _dev),
    (SELECT count(*) FROM _dev),
    (SELECT coalesce(sum(rate_micros), 0)::BIGINT FROM _dev),
    coalesce(sum(CASE WHEN sharing NOT IN ('idle', 'down', 'adjustment')
                      THEN cost - idle_share END), 0),
    coalesce(sum(idle_share), 0),
    coalesce(sum(CASE WHEN team = 'idle' AND sharing = 'idle' THEN cost END), 0),
    coalesce(sum(CASE WHEN sharing = 'down' THEN cost END), 0),
    coalesce(sum(CASE WHEN sharing = 'adjustment' THEN cost END), 0),
    coalesce(sum(cost), 0),
    count(*)
FROM charges
WHERE hour >= getvariable('gl_start') AND hour < getvariable('gl_end')
  AND cluster = getvariable('gl_cluster');

-- query: orphans
-- Allocation facts with no device fact in the same hour cannot be priced (no model, no fleet
-- cost); they are counted and reported, not guessed at. _alloc holds one row per fact that
-- joined a device (every other join there is on a unique key). Per hour: pricing records
-- them with the hour (metering/pricedhours.py).
SELECT f.hour, f.n - coalesce(a.n, 0)
FROM (SELECT hour, count(*) AS n FROM allocation_hours
      WHERE hour >= getvariable('gl_start') AND hour < getvariable('gl_end')
        AND cluster = getvariable('gl_cluster')
      GROUP BY hour) f
LEFT JOIN (SELECT hour, count(*) AS n FROM _alloc GROUP BY hour) a USING (hour)
WHERE f.n <> coalesce(a.n, 0);

-- query: holders_unique
-- Whether each holder (hour x namespace x pod x container x device x MIG instance, the key of
-- allocation_hours) has one _rows row: the facts' keys are unique (ingest groups by them), so
-- it has; waste_rows relies on it. A hash collision says false: the slower, exact way is taken.
SELECT count(*) = 0 FROM (SELECT hour, row_key FROM _rows GROUP BY ALL HAVING count(*) > 1);

-- query: waste_rows
-- The slice's rows of waste.sql `device_hours` (metering/wastehours.py), from the work tables
-- that already joined each allocation fact with its device and MIG facts and hold its team,
-- cost and energy, instead of joining the facts with `charges` and `energy_hours` again. The
-- same rows when each holder has one _rows row (holders_unique): its charge row's cost less
-- idle share is its final_micros, its energy row its _eheld row
-- (tests/test_waste_from_pricing.py compares them with the query's). Run while no closed
-- hour's charges are restored over the slice's (metering/closes.py), i.e. without a freeze.
INSERT INTO waste_hours
WITH a AS (
    SELECT a.namespace,
           coalesce(nullif(w.owner_kind, ''), 'Pod') AS owner_kind,
           coalesce(nullif(w.owner_name, ''), a.pod) AS owner_name,
           a.model, a.sharing, a.waste_profile AS profile, a.hour, a.uuid, a.mig_uuid,
           a.waste_held_s AS held_s, a.waste_sm_s AS sm_seconds, w.memory_max_bytes AS mem_max,
           a.waste_inst_sm AS inst_sm,
           -- the query reads holders' charge and energy rows where pod <> ''
           CASE WHEN a.pod <> '' THEN r.team END AS team,
           CASE WHEN a.pod <> '' THEN gl_money(r.final_micros) END AS cost,
           CASE WHEN a.pod <> '' THEN gl_milli(e.mj_row) END AS joules,
           CASE WHEN a.pod <> '' THEN gl_milli(e.co2_row) END AS grams,
           r.device_holders > 1 AS grouped
    FROM _rows r
    JOIN _alloc a ON a.rowid = r.aid
    LEFT JOIN _eheld e ON e.aid = r.aid
    LEFT JOIN workload_hours w ON w.hour = a.hour AND w.cluster = getvariable('gl_cluster')
         AND w.namespace = a.namespace AND w.pod = a.pod AND w.container = a.container
         AND w.uuid = a.uuid AND w.mig_uuid = a.mig_uuid
         AND w.hour >= getvariable('gl_start') AND w.hour < getvariable('gl_end')
    WHERE a.waste_held_s > 0
), dh AS (
    -- the query's grouping, over the rows of devices with more than one holder
    SELECT namespace, owner_kind, owner_name, model, sharing, profile, hour,
           max(held_s) / 3600.0 AS held_h,
           CASE WHEN count(mem_max) = count(*) THEN sum(mem_max) END AS mem_max,
           CASE WHEN mig_uuid <> '' THEN any_value(inst_sm)
                WHEN count(sm_seconds) = count(*)
                    THEN least(sum(sm_seconds) / nullif(max(held_s), 0), 1.0) END AS sm,
           max(team) AS team, coalesce(sum(cost), 0) AS cost,
           coalesce(sum(joules), 0) AS joules, sum(grams) AS grams
    FROM a WHERE grouped
    GROUP BY namespace, owner_kind, owner_name, model, sharing, profile, hour, uuid, mig_uuid
    UNION ALL
    -- the same figures of a group of one row, without grouping: a sum of one value x is
    -- 0 + x (the same double: -0.0 becomes 0.0 as in sum())
    SELECT namespace, owner_kind, owner_name, model, sharing, profile, hour,
           held_s / 3600.0, mem_max + 0.0,
           CASE WHEN mig_uuid <> '' THEN inst_sm
                WHEN sm_seconds IS NOT NULL
                    THEN least((sm_seconds + 0.0) / nullif(held_s, 0), 1.0) END,
           team, coalesce(cost, 0), coalesce(joules, 0), grams
    FROM a WHERE NOT grouped
)
SELECT getvariable('gl_cluster'), namespace, owner_kind, owner_name, model, sharing, profile,
       hour, held_h, mem_max, sm, team, cost,
       coalesce(mem_max = 0 AND coalesce(sm, 0) = 0, false) AS idle, joules, grams
FROM dh;

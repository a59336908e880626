-- GPU Ledger waste: rightsizing and idle-holder figures per workload, read from the ledger's
-- facts and charges by metering/report/waste.py. Read-only towards the ledger: the working
-- tables are temporary.
--
-- A workload is its controller within one cluster: the same namespace and Deployment name in
-- two clusters are two workloads, each sized by its own hours and priced by its cluster's
-- rules. Its key is (cluster, namespace, owner_kind, owner_name, model, sharing, profile).

-- query: device_hours
-- Per device-hour (one hour, device or MIG instance a workload held) of one slice [$start,
-- $end) of the facts and charges: the workload's containers there are summed (peak memory
-- adds up: an upper bound of the unit's peak). Pricing stores its hours' rows in the ledger's
-- waste_hours (metering/wastehours.py); the report reads those in place and inserts the rest a
-- day at a time into a temporary table, so the joins' working set is a day's rows whatever
-- the month's size; the temporary view waste_device_hours is both. Every row is one hour of
-- one cluster.
WITH a AS (
    SELECT a.hour, a.cluster, a.namespace, a.pod, a.container, a.uuid, a.mig_uuid, a.sharing,
           coalesce(nullif(w.owner_kind, ''), 'Pod') AS owner_kind,
           coalesce(nullif(w.owner_name, ''), a.pod) AS owner_name,
           d.model, least(a.allocated_seconds, 3600) AS held_s, a.sm_seconds,
           w.memory_max_bytes AS mem_max,
           coalesce(mh.profile, '') AS profile,
           mh.sm_active_seconds / nullif(mh.observed_seconds, 0) AS inst_sm
    FROM allocation_hours a
    JOIN device_hours d ON d.hour = a.hour AND d.cluster = a.cluster AND d.uuid = a.uuid
         AND d.hour >= $start AND d.hour < $end
    LEFT JOIN workload_hours w ON w.hour = a.hour AND w.cluster = a.cluster
         AND w.namespace = a.namespace AND w.pod = a.pod AND w.container = a.container
         AND w.uuid = a.uuid AND w.mig_uuid = a.mig_uuid
         AND w.hour >= $start AND w.hour < $end
    LEFT JOIN mig_hours mh ON a.mig_uuid <> '' AND mh.hour = a.hour AND mh.cluster = a.cluster
         AND mh.mig_uuid = a.mig_uuid AND mh.hour >= $start AND mh.hour < $end
    WHERE a.hour >= $start AND a.hour < $end AND a.allocated_seconds > 0
), ce AS (
    -- per holder: its charges' team and cost, and its share of the device-hour's measured
    -- energy (pricing's energy_hours); one grouping of both tables' holder rows, NULL where a
    -- holder has none of the one or the other
    SELECT hour, cluster, namespace, pod, container, uuid, mig_uuid,
           any_value(team) FILTER (WHERE charge) AS team,
           sum(cost) FILTER (WHERE charge) AS cost,
           sum(joules) FILTER (WHERE NOT charge) AS joules,
           sum(grams) FILTER (WHERE NOT charge) AS grams
    FROM (SELECT hour, cluster, namespace, pod, container, uuid, mig_uuid, true AS charge,
                 team, cost - idle_share AS cost, NULL::DECIMAL(18, 3) AS joules,
                 NULL::DECIMAL(18, 3) AS grams
          FROM charges WHERE hour >= $start AND hour < $end AND pod <> ''
          UNION ALL
          SELECT hour, cluster, namespace, pod, container, uuid, mig_uuid, false, NULL, NULL,
                 energy_joules, co2e_grams
          FROM energy_hours WHERE hour >= $start AND hour < $end AND pod <> '')
    GROUP BY hour, cluster, namespace, pod, container, uuid, mig_uuid
), dh AS (
    SELECT a.cluster, a.namespace, a.owner_kind, a.owner_name, a.model, a.sharing, a.profile,
           a.hour, a.uuid, a.mig_uuid,
           max(a.held_s) / 3600.0 AS held_h,
           -- unknown (NULL) as soon as one container's figure is unknown
           CASE WHEN count(a.mem_max) = count(*) THEN sum(a.mem_max) END AS mem_max,
           CASE WHEN a.mig_uuid <> '' THEN any_value(a.inst_sm)
                WHEN count(a.sm_seconds) = count(*)
                    THEN least(sum(a.sm_seconds) / nullif(max(a.held_s), 0), 1.0) END AS sm,
           max(c.team) AS team, coalesce(sum(c.cost), 0) AS cost,
           coalesce(sum(c.joules), 0) AS joules, sum(c.grams) AS grams
    FROM a
    LEFT JOIN ce c ON c.hour = a.hour AND c.cluster = a.cluster AND c.namespace = a.namespace
         AND c.pod = a.pod AND c.container = a.container AND c.uuid = a.uuid
         AND c.mig_uuid = a.mig_uuid
    GROUP BY a.namespace, a.owner_kind, a.owner_name, a.model, a.sharing, a.profile, a.hour,
             a.cluster, a.uuid, a.mig_uuid
)
-- A device-hour with peak memory 0 and no SM activity ran no GPU process: it is idle
-- holding, priced apart; rightsizing looks at the other (busy) device-hours only, so the
-- two kinds never count the same hour twice.
SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, hour, held_h,
       mem_max, sm, team, cost, coalesce(mem_max = 0 AND coalesce(sm, 0) = 0, false) AS idle,
       joules, grams
FROM dh;

-- query: p95
-- Per workload, the nearest-rank 95th percentile of its busy device-hours' peak memory and SM
-- activity (measure 'mem' / 'sm'): what DuckDB's quantile_disc(v, 0.95) gives (the value at
-- 1-based rank max(1, n - floor(n - n * 0.95)), in double arithmetic as DuckDB computes it),
-- from a histogram of the values and a running count. quantile_disc holds every value of a
-- group in memory and cannot spill; a grouped count and a window can.
CREATE OR REPLACE TEMP TABLE waste_p95 AS
SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, measure, min(v) FILTER (WHERE below < rank AND rank <= upto) AS p95
FROM (SELECT *, upto - k AS below,
             greatest(1, n - floor(n - n * 0.95::DOUBLE)) AS rank
      FROM (SELECT *, sum(k) OVER (PARTITION BY cluster, namespace, owner_kind, owner_name, model, sharing, profile, measure ORDER BY v) AS upto,
                   sum(k) OVER (PARTITION BY cluster, namespace, owner_kind, owner_name, model, sharing, profile, measure) AS n
            FROM (SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, measure, v, count(*) AS k FROM (
                      SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, 'mem' AS measure, CAST(mem_max AS DOUBLE) AS v
                      FROM waste_device_hours WHERE NOT idle
                      UNION ALL
                      SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, 'sm', CAST(sm AS DOUBLE) FROM waste_device_hours WHERE NOT idle)
                  WHERE v IS NOT NULL GROUP BY ALL)))
GROUP BY ALL;

-- query: workloads
-- Per workload x GPU model x unit held, from waste_device_hours and waste_p95. Quantiles are
-- nearest-rank over device-hours, so every figure is one that was observed. Only grouped
-- aggregates and windows (both spill to disk under the memory limit): no holistic aggregate
-- (quantile, mode, DISTINCT), which would hold a month of device-hours in memory.
WITH g AS (
    SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile,
           coalesce(sum(held_h) FILTER (WHERE NOT idle), 0) AS device_hours,
           max(mem_max) FILTER (WHERE NOT idle) AS peak_mem,
           coalesce(count(*) FILTER (WHERE NOT idle AND mem_max IS NOT NULL AND sm IS NOT NULL)
                    / nullif(count(*) FILTER (WHERE NOT idle), 0), 0) AS coverage,
           count(*) FILTER (WHERE idle) AS idle_dh,
           -- idle holding is judged on every held device-hour: those with a memory figure
           count(mem_max) / count(*) AS held_coverage,
           coalesce(sum(cost) FILTER (WHERE NOT idle), 0) AS cost,
           coalesce(sum(cost) FILTER (WHERE idle), 0) AS idle_cost,
           -- measured energy (J) and CO2e (g) of the busy and the idle device-hours
           coalesce(sum(joules) FILTER (WHERE NOT idle), 0) AS joules,
           coalesce(sum(joules) FILTER (WHERE idle), 0) AS idle_joules,
           sum(grams) FILTER (WHERE NOT idle) AS grams,
           sum(grams) FILTER (WHERE idle) AS idle_grams
    FROM waste_device_hours GROUP BY ALL
), hours AS (  -- hours the workload held a unit, and those in which one was busy
    SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, count(*) FILTER (WHERE busy) AS hours, count(*) AS all_hours
    FROM (SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, hour, bool_or(NOT idle) AS busy FROM waste_device_hours GROUP BY ALL)
    GROUP BY ALL
), team AS (  -- the team of most of its device-hours (ties: the first name)
    SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, team FROM (
        SELECT *, row_number() OVER (PARTITION BY cluster, namespace, owner_kind, owner_name, model, sharing, profile ORDER BY k DESC, team) AS r
        FROM (SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, team, count(*) AS k FROM waste_device_hours
              WHERE team IS NOT NULL GROUP BY ALL))
    WHERE r = 1
), mem AS (SELECT * FROM waste_p95 WHERE measure = 'mem'
), sm AS (SELECT * FROM waste_p95 WHERE measure = 'sm'
)
SELECT cluster, namespace, owner_kind, owner_name, model, sharing, profile, team.team, hours.hours, g.device_hours, g.peak_mem, mem.p95 AS p95_mem,
       sm.p95 AS p95_sm, g.coverage, g.idle_dh, hours.all_hours, g.cost, g.idle_cost,
       g.held_coverage, g.joules, g.idle_joules, g.grams, g.idle_grams
FROM g JOIN hours USING (cluster, namespace, owner_kind, owner_name, model, sharing, profile)
LEFT JOIN team USING (cluster, namespace, owner_kind, owner_name, model, sharing, profile)
LEFT JOIN mem USING (cluster, namespace, owner_kind, owner_name, model, sharing, profile)
LEFT JOIN sm USING (cluster, namespace, owner_kind, owner_name, model, sharing, profile)
ORDER BY ALL;

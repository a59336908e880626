-- GPU Ledger report: the monthly report's tables, read from the ledger's views (metering/
-- ledgerview.py) by metering/report/builder.py. Read-only: every section is a `-- query:`
-- run by name with the parameters $start and $end (the month, [start, end)).
--
-- Every sum is an exact DECIMAL (hours are cast before summing), so the figures do not
-- depend on the order DuckDB's parallel aggregation adds rows in: the same ledger gives the
-- same report, byte for byte, on every run.

-- query: report_charges
-- The month's (or a day's) charge rows as the sections read them: `kind` splits fleet rows
-- (idle, down, adjustment) from charged rows, `down_hours` is a down row's device-hours.
CREATE OR REPLACE TEMP MACRO gl_report_charges(lo, hi) AS TABLE
SELECT *, CAST(allocated_gpu_hours AS DECIMAL(38, 9)) AS alloc,
       CASE WHEN team = sharing AND team IN ('idle', 'down', 'adjustment') THEN team
            ELSE '' END AS kind,
       CASE WHEN team = sharing AND team = 'down' THEN CAST(fraction AS DECIMAL(38, 9))
            ELSE 0 END AS down_hours
FROM charges WHERE hour >= lo AND hour < hi;

-- query: idle_fleet_table
CREATE OR REPLACE TEMP TABLE _gl_idle_fleet (
    cluster VARCHAR, team VARCHAR, namespace VARCHAR, pod VARCHAR, model VARCHAR,
    sharing VARCHAR, profile VARCHAR, day VARCHAR, kind VARCHAR, fleet_hours DECIMAL(38, 9));

-- query: idle_fleet_hours
-- An idle row stands for the device-hour's time nobody held: what is left of it after the
-- down time and the allocated GPU-hours, so that allocated + idle + down is the device-hour
-- exactly (its `fraction` is derived from money rounded to the micro, which left totals a few
-- millionths of an hour off the capacity). Summed per key of the idle rows, for the hours
-- [$start, $end): run a day at a time, since each device-hour lies in one day (over a month of
-- charges the window spilled: the sections query took 75 s at 80,000 GPUs with it, 13.6 s
-- without, and these day sums 20 s; docs/performance.md).
INSERT INTO _gl_idle_fleet
SELECT cluster, team, namespace, pod, model, sharing, profile,
       CAST(CAST(hour AS DATE) AS VARCHAR) AS day, kind, sum(fleet_hours)
FROM (SELECT *, greatest(1 - sum(down_hours + alloc) OVER (PARTITION BY cluster, hour, uuid),
                         0) AS fleet_hours
      FROM gl_report_charges($start, $end))
WHERE kind = 'idle'
GROUP BY ALL;

-- query: sections
-- Every table of the report in one pass over the month's charges: one row per group of each
-- grouping set, named by `section`. Every grouping but `fleet` and `clusters` also splits
-- fleet rows (idle, down, adjustment) from charged rows (`kind`), so an idle row is never
-- merged with a namespace or model row that happens to share its key.
-- used is NULL where SM activity is unknown: SUM() adds the known rows only, and the
-- allocated hours of the unknown ones are summed apart (sm_unknown), so efficiency compares
-- like with like. fleet_hours: the device-hours idle and down rows stand for (a team's
-- 'idle-share' row under policy weights carries a weight in its fraction, not hours, and is
-- not a fleet row): a down row's own, and the idle rows' from _gl_idle_fleet (filled by
-- idle_fleet_hours for the month), added as rows of their keys that count no charge (n = 0)
-- and hold nothing else (NULL: SUM skips them).
WITH c AS (
    SELECT 1 AS n, cluster, team, namespace, pod, model, sharing, profile,
           CAST(CAST(hour AS DATE) AS VARCHAR) AS day, kind, alloc,
           CAST(used_gpu_hours AS DECIMAL(38, 9)) AS used,
           cost, idle_share,
           CASE WHEN used_gpu_hours IS NULL THEN alloc ELSE 0 END AS sm_unknown,
           CASE WHEN used_gpu_hours IS NULL AND mig_uuid <> '' THEN alloc ELSE 0 END
               AS sm_unknown_mig,
           CASE WHEN kind = 'down' THEN down_hours ELSE 0 END AS fleet_hours
    FROM gl_report_charges($start, $end)
    UNION ALL
    SELECT 0, cluster, team, namespace, pod, model, sharing, profile, day, kind, NULL, NULL,
           NULL, NULL, NULL, NULL, fleet_hours
    FROM _gl_idle_fleet
)
SELECT CASE WHEN grouping(day) = 0 THEN 'team_days'
            WHEN grouping(pod) = 0 THEN 'pods'
            WHEN grouping(model) = 0 THEN 'models'
            WHEN grouping(namespace) = 0 THEN 'namespaces'
            WHEN grouping(team) = 0 THEN 'teams'
            WHEN grouping(cluster) = 0 THEN 'clusters'
            ELSE 'fleet' END AS section,
       coalesce(cluster, '') AS cluster, coalesce(team, '') AS team,
       coalesce(namespace, '') AS namespace, coalesce(pod, '') AS pod,
       coalesce(model, '') AS model, coalesce(sharing, '') AS sharing,
       coalesce(profile, '') AS profile, coalesce(day, '') AS day, coalesce(kind, '') AS kind,
       sum(n) AS charge_rows, SUM(alloc), SUM(used), SUM(cost), SUM(idle_share),
       SUM(sm_unknown), SUM(fleet_hours), SUM(sm_unknown_mig)
FROM c
GROUP BY GROUPING SETS ((), (cluster), (team, kind), (namespace, kind),
                        (team, namespace, pod, kind), (model, sharing, profile, kind),
                        (day, team, kind))
-- an empty month still has its (empty) fleet row: drop it, a month without charges has none
HAVING sum(n) > 0;

-- query: energy_reported
-- Whether the month's energy was priced or carbon reported: then every output shows energy
-- and CO2e columns (a cost model without `energy:` and `carbon:` keeps its bills as they were).
SELECT EXISTS (SELECT 1 FROM energy_hours WHERE hour >= $start AND hour < $end
               AND (energy_cost IS NOT NULL OR co2e_grams IS NOT NULL)),
       EXISTS (SELECT 1 FROM energy_hours WHERE hour >= $start AND hour < $end
               AND energy_cost IS NOT NULL),
       EXISTS (SELECT 1 FROM energy_hours WHERE hour >= $start AND hour < $end
               AND co2e_grams IS NOT NULL);

-- query: energy_sections
-- The energy rows summed by the groupings of `sections` (same section names and keys):
-- joules, energy cost and grams of CO2e, exact DECIMAL sums. Idle and down energy are fleet
-- rows (kind idle / down) as their charges are.
WITH c AS (
    SELECT cluster, team, namespace, pod, model, sharing, profile,
           CAST(CAST(hour AS DATE) AS VARCHAR) AS day,
           CASE WHEN team = sharing AND team IN ('idle', 'down') THEN team ELSE '' END AS kind,
           energy_joules, energy_cost, co2e_grams,
           CASE WHEN estimated THEN energy_joules ELSE 0 END AS estimated_joules
    FROM energy_hours WHERE hour >= $start AND hour < $end
)
SELECT CASE WHEN grouping(day) = 0 THEN 'team_days'
            WHEN grouping(pod) = 0 THEN 'pods'
            WHEN grouping(model) = 0 THEN 'models'
            WHEN grouping(namespace) = 0 THEN 'namespaces'
            WHEN grouping(team) = 0 THEN 'teams'
            WHEN grouping(cluster) = 0 THEN 'clusters'
            ELSE 'fleet' END AS section,
       coalesce(cluster, '') AS cluster, coalesce(team, '') AS team,
       coalesce(namespace, '') AS namespace, coalesce(pod, '') AS pod,
       coalesce(model, '') AS model, coalesce(sharing, '') AS sharing,
       coalesce(profile, '') AS profile, coalesce(day, '') AS day, coalesce(kind, '') AS kind,
       SUM(energy_joules), SUM(energy_cost), SUM(co2e_grams), SUM(estimated_joules)
FROM c
GROUP BY GROUPING SETS ((), (cluster), (team, kind), (namespace, kind),
                        (team, namespace, pod, kind), (model, sharing, profile, kind),
                        (day, team, kind))
HAVING count(*) > 0;

-- query: covered_hours
-- Hours with data from every cluster metered in the month: an hour one cluster lacks is a
-- gap of the fleet, not hidden by the others.
SELECT hour FROM coverage WHERE hour >= $start AND hour < $end GROUP BY hour
HAVING count(DISTINCT CASE WHEN devices > 0 THEN cluster END) =
       (SELECT count(DISTINCT cluster) FROM coverage WHERE hour >= $start AND hour < $end);

-- query: last_hour
-- The last hour of the month with data or charges (NULL: none).
SELECT max(h) FROM (
    SELECT max(hour) AS h FROM coverage WHERE hour >= $start AND hour < $end AND devices > 0
    UNION ALL SELECT max(hour) FROM charges WHERE hour >= $start AND hour < $end);

-- query: capacity_devices
-- Per GPU model: the devices the fleet owned in [$start, $end). A device is counted when
-- ingest saw it or pricing charged it (a ledger may hold charges only). Each side is
-- grouped to its devices first (as many groups as GPUs), so nothing hashes a month of rows.
SELECT model, count(*) FROM (
    SELECT model, cluster, uuid FROM device_hours
    WHERE hour >= $start AND hour < $end GROUP BY ALL
    UNION SELECT model, cluster, uuid FROM charges
    WHERE hour >= $start AND hour < $end AND uuid <> '' GROUP BY ALL)
GROUP BY model ORDER BY model;

-- query: capacity_hours
-- Per GPU model: the device-hours of [$start, $end), seen by ingest or charged by pricing,
-- each once. Run a day at a time (metering/report/builder.py): a month's union, 115M rows at
-- 80,000 GPUs, ran out of memory under the 1.5GB cap. UNION removes the duplicates: a
-- DISTINCT on each side would hash every row twice (docs/performance.md).
SELECT model, count(*) FROM (
    SELECT hour, cluster, uuid, model FROM device_hours
    WHERE hour >= $start AND hour < $end
    UNION SELECT hour, cluster, uuid, model FROM charges
    WHERE hour >= $start AND hour < $end AND uuid <> '')
GROUP BY model ORDER BY model;

-- query: priced_hashes
SELECT DISTINCT cost_model_hash FROM charges WHERE hour >= $start AND hour < $end ORDER BY 1;

-- query: has_facts
-- Whether ingest wrote usage for the month (whatever pricing has done with it).
SELECT EXISTS (SELECT 1 FROM device_hours WHERE hour >= $start AND hour < $end)
    OR EXISTS (SELECT 1 FROM allocation_hours WHERE hour >= $start AND hour < $end);

-- query: clusters
SELECT DISTINCT cluster FROM charges WHERE hour >= $start AND hour < $end ORDER BY 1;

-- query: stored_cost_model
-- The ledger's copy of the cost model the charges were priced with ($hash).
SELECT name, currency, document FROM cost_models WHERE hash = $hash;

-- query: charge_days
-- Charges summed per UTC day x team x namespace x pod x GPU model x sharing x profile x
-- cluster: the grain of the FOCUS export. charged: the device-hours the money is for (an
-- idle-share row of policy weights carries the team's weight in fraction, no hours).
SELECT CAST(CAST(hour AS DATE) AS TIMESTAMP), team, namespace, pod, model, sharing, profile,
       CASE WHEN team = sharing AND team IN ('idle', 'down', 'adjustment') THEN team
            ELSE '' END,
       cluster,
       SUM(CASE WHEN basis = 'idle-share' THEN 0 ELSE CAST(fraction AS DECIMAL(38, 9)) END),
       SUM(CAST(allocated_gpu_hours AS DECIMAL(38, 9))),
       SUM(CAST(used_gpu_hours AS DECIMAL(38, 9))), SUM(cost), SUM(idle_share)
FROM charges WHERE hour >= $start AND hour < $end GROUP BY ALL ORDER BY ALL;

-- query: charged_models
-- The clusters and GPU models of the month's charges (the FOCUS export's per-cluster prices).
SELECT DISTINCT cluster, model FROM charges WHERE hour >= $start AND hour < $end;

-- query: cluster_models
-- The GPU models of each cluster in the month, as ingest saw them or pricing charged them,
-- with their vendor where the facts say (a model two vendors share: one of them).
SELECT cluster, model, max(vendor) FROM (
    SELECT DISTINCT cluster, model, vendor FROM device_hours
    WHERE hour >= $start AND hour < $end
    UNION ALL
    SELECT DISTINCT cluster, model, NULL FROM charges
    WHERE hour >= $start AND hour < $end AND uuid <> '')
GROUP BY cluster, model ORDER BY ALL;

-- query: energy_days
-- Energy rows summed at the FOCUS export's grain (as charge_days): kWh from joules, the
-- energy cost and grams of CO2e (NULL where the cost model did not price / give carbon).
SELECT CAST(CAST(hour AS DATE) AS TIMESTAMP), team, namespace, pod, model, sharing, profile,
       CASE WHEN team = sharing AND team IN ('idle', 'down') THEN team ELSE '' END,
       cluster, SUM(energy_joules), SUM(energy_cost), SUM(co2e_grams)
FROM energy_hours WHERE hour >= $start AND hour < $end GROUP BY ALL ORDER BY ALL;

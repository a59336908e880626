-- GPU Ledger facts: per-series hourly signals -> fact rows for hours [gl_start, gl_end) of one
-- chunk. Run by metering/facts.py inside the caller's transaction: every `-- step:` section in
-- file order; `-- query:` sections are run by name where Python needs their rows or picks one
-- of two forms (pick_*, agg_*).
--
-- Inputs (registered Arrow tables, one per SignalSpec in facts.py): up_count, up_sum, up_tlast,
-- info_count, util_sum, energy_last, energy_min, power_sum, mig_count, mig_tlast, migmem_max,
-- gpm_sum, alloc_count, alloc_sum, alloc_tlast, cmem_sum, cmem_max, csm_sum, cmemfrac_max,
-- ccorefrac_max; each row is one series x hour with `sh` (series hash), `key` (hash of the labels
-- that identify the fact row, cluster included), `cluster`, `value` and the labels the spec keeps
-- (only those read here). `spacing` holds the seconds per sample detected per (cluster, node)
-- where they differ from gl_dflt: every statement reads them as coalesce(row, gl_dflt).
-- Session variables: gl_start, gl_end (chunk), gl_dflt (seconds per sample where a node has none
-- detected, or its own), gl_hour_s (seconds in an hour: signals.HOUR_S).
--
-- Every statement works per (hour, key) on integers: the series with the most samples (`w`,
-- ties broken by its id) names the fact row, and only that series' string labels are read
-- back, by a join on (series hash, hour). Hashing six strings per sample to group and join was
-- most of the time of a chunk. Where no key of a node group has two series, each (hour, key)
-- has one row per signal, and nothing is grouped (pick_single, agg_single).

-- query: spacing
-- Samples per series-hour and how often each count occurs, per node; facts.detect_spacing picks
-- the mode (full hours dominate; partial hours and jitter of one sample do not move it).
SELECT cluster, node, value AS n, count(*) AS k FROM up_count
WHERE hour >= getvariable('gl_start') AND hour < getvariable('gl_end') AND value > 0
GROUP BY cluster, node, value;

-- query: pending
-- Allocation or MIG samples in the chunk: they need a sample spacing even without gpu_up.
SELECT (SELECT count(*) FROM alloc_count
        WHERE hour >= getvariable('gl_start') AND hour < getvariable('gl_end'))
     + (SELECT count(*) FROM mig_count
        WHERE hour >= getvariable('gl_start') AND hour < getvariable('gl_end'));

-- query: clusters
-- Clusters the chunk's signals hold (a global store metered with a cluster label).
SELECT DISTINCT cluster FROM (
    SELECT cluster FROM up_count UNION ALL SELECT cluster FROM alloc_count
    UNION ALL SELECT cluster FROM mig_count)
WHERE cluster <> '' ORDER BY cluster;

-- query: clash_in_group
-- One GPU (uuid in its cluster) seen all hour by two nodes or more in one node group: two
-- identical nodes, not a relabelled `node`, whose series follow each other in time
-- (docs/metering.md, "Several series for one key"). "All hour": the node's own sample seconds
-- (duplicates on one node once) within two sample spacings of it. Runs after `macros`.
WITH s AS (
    SELECT c.cluster, c.uuid, c.node, c.hour,
           max(c.value * coalesce(sp.seconds, getvariable('gl_dflt'))) AS sec,
           max(coalesce(sp.seconds, getvariable('gl_dflt'))) AS dt
    FROM up_count c LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
    WHERE gl_in(c.hour)
    GROUP BY c.cluster, c.uuid, c.node, c.hour)
SELECT uuid, min(node), max(node), hour FROM s WHERE sec >= getvariable('gl_hour_s') - 2 * dt
GROUP BY cluster, uuid, hour HAVING count(*) > 1 ORDER BY hour, uuid LIMIT 1;

-- query: clash_across_groups
-- The same over the device hours node groups wrote one after another: a GPU observed all hour
-- (but `$slack` seconds) by two nodes of the clusters `$clusters`.
WITH d AS (
    SELECT cluster, uuid, node, hour FROM device_hours
    WHERE gl_in(hour) AND cluster IN (SELECT unnest($clusters))
      AND observed_seconds >= getvariable('gl_hour_s') - $slack
), moved AS (
    -- the GPUs on two nodes at all in the chunk, few or none: grouping by GPU alone first
    -- keeps the per-hour grouping to them (0.5-0.75x the CPU at 5.76M device-hours)
    SELECT cluster, uuid FROM d GROUP BY cluster, uuid HAVING min(node) <> max(node)
)
SELECT uuid, min(node), max(node), hour FROM d SEMI JOIN moved USING (cluster, uuid)
-- (min <> max: two nodes or more, without count(DISTINCT)'s set per group: 0.3x the CPU at
-- 1.9M device-hours)
GROUP BY cluster, uuid, hour HAVING min(node) <> max(node) ORDER BY hour, uuid LIMIT 1;

-- step: macros
CREATE OR REPLACE TEMP MACRO gl_in(h) AS
    h >= getvariable('gl_start') AND h < getvariable('gl_end');
-- A series' weight in naming its key's fact row: its sample count, ties broken by the low 32
-- bits of its id (sh), packed in one BIGINT for arg_max.
CREATE OR REPLACE TEMP MACRO gl_w(n, sh) AS CAST(n AS BIGINT) * 4294967296 + (sh & 4294967295);
-- Seconds a key held in an hour: its samples' seconds, at most the union of its series' spans
-- (overlapping duplicates counted once), at most the hour.
CREATE OR REPLACE TEMP MACRO gl_sec(raw, held) AS
    least(raw, coalesce(held, raw), getvariable('gl_hour_s'));
-- Integrals are scaled by held / sampled seconds: overlapping duplicates are averaged.
CREATE OR REPLACE TEMP MACRO gl_scale(raw, held) AS (gl_sec(raw, held) / raw);
-- The (hour, key) where signal table `t` has more series than its family's count signal
-- `c` (facts.py, FactCounts.more_series): `t`'s values are added up there (agg_grouped),
-- right where its series followed each other, twice over where they overlapped (a family
-- duplicated alone), which the samples read cannot tell apart (docs/metering.md, "Several
-- series for one key"). Asked only of a signal with a key of two series.
CREATE OR REPLACE TEMP MACRO gl_more_series(t, c) AS TABLE
SELECT s.cluster, count(*) AS n FROM (
    SELECT cluster, hour, key, count(DISTINCT sh) AS n FROM query_table(t) WHERE gl_in(hour)
    GROUP BY cluster, hour, key HAVING count(DISTINCT sh) > 1) s
LEFT JOIN (SELECT hour, key, count(DISTINCT sh) AS n FROM query_table(c) WHERE gl_in(hour)
           GROUP BY hour, key) u USING (hour, key)
WHERE s.n > coalesce(u.n, 0)
GROUP BY s.cluster;

-- step: spans
-- A key with several series in an hour sums them where they follow each other (exporter
-- restart on a new instance, pod relabelled, replicas changed) and counts the time once where
-- they overlap (one exporter scraped by two jobs, an HA pair in one store): each series'
-- samples span [last - count x spacing, last]. No scrape label (job, instance, replica) is
-- looked at. `fam` says which fact table the span is for.
CREATE OR REPLACE TEMP TABLE _spans AS
SELECT 'device' AS fam, c.hour, c.key, coalesce(sp.seconds, getvariable('gl_dflt')) AS dt,
       t.value - c.value * coalesce(sp.seconds, getvariable('gl_dflt')) AS s, t.value AS e
FROM up_count c JOIN up_tlast t ON t.sh = c.sh AND t.hour = c.hour
LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
WHERE gl_in(c.hour)
UNION ALL
SELECT 'mig', c.hour, c.key, coalesce(sp.seconds, getvariable('gl_dflt')),
       t.value - c.value * coalesce(sp.seconds, getvariable('gl_dflt')), t.value
FROM mig_count c JOIN mig_tlast t ON t.sh = c.sh AND t.hour = c.hour
LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
WHERE gl_in(c.hour)
UNION ALL
SELECT 'alloc', c.hour, c.key, coalesce(sp.seconds, getvariable('gl_dflt')),
       t.value - c.value * coalesce(sp.seconds, getvariable('gl_dflt')), t.value
FROM alloc_count c JOIN alloc_tlast t ON t.sh = c.sh AND t.hour = c.hour
LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
WHERE gl_in(c.hour);

-- step: held
-- Per (fam, hour, key): seconds covered by the union of the spans, each run of overlapping
-- spans in whole sample spacings (two copies scraped 7 s apart hold what one does, not 7 s
-- more).
CREATE OR REPLACE TEMP TABLE _held AS
SELECT fam, hour, key, sum(floor((ge - gs) / dt + 1e-6) * dt) AS u FROM (
    SELECT fam, hour, key, g, min(s) AS gs, max(e) AS ge, max(dt) AS dt FROM (
        SELECT fam, hour, key, dt, s, e,
               sum(CASE WHEN prev IS NULL OR s > prev THEN 1 ELSE 0 END)
                   OVER (PARTITION BY fam, hour, key ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS g
        FROM (SELECT fam, hour, key, dt, s, e,
                     max(e) OVER (PARTITION BY fam, hour, key ORDER BY s, e
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
              FROM _spans))
    GROUP BY fam, hour, key, g)
GROUP BY fam, hour, key;

-- query: no_spans
-- Instead of the spans step when no key has two series (metering/facts.py): nothing to merge.
CREATE OR REPLACE TEMP TABLE _spans (fam VARCHAR, hour TIMESTAMP, key BIGINT, dt DOUBLE,
                                     s DOUBLE, e DOUBLE);

-- query: no_held
-- Instead of the held step then: a key's seconds are its one series' samples' (gl_sec).
CREATE OR REPLACE TEMP TABLE _held (fam VARCHAR, hour TIMESTAMP, key BIGINT, u DOUBLE);

-- query: pick_grouped
-- Which series names each fact row (hour, key) of a device, MIG instance or allocation, with the
-- row's seconds: the one with the most samples, ties broken by its id (a key with two series or
-- more: exporter restart, relabel, duplicate scrape). Run before the fact steps when some key has
-- two series (metering/facts.py), pick_single otherwise; both define the table macros the steps
-- read, with the same columns: gl_device(), gl_mig() and gl_allocation() (each row's series'
-- labels and the row's seconds), gl_holder() (an allocation row's series' labels alone).
CREATE OR REPLACE TEMP MACRO gl_device() AS TABLE
SELECT d.hour, d.key, d.obs, d.up, c.cluster, c.node, c.gpu, c.uuid, c.model
FROM (SELECT c.hour, c.key, arg_max(c.sh, gl_w(c.value, c.sh)) AS sh,
             sum(c.value * coalesce(sp.seconds, getvariable('gl_dflt'))) AS obs,
             sum(coalesce(s.value, 0) * coalesce(sp.seconds, getvariable('gl_dflt'))) AS up
      FROM up_count c
      LEFT JOIN up_sum s ON s.sh = c.sh AND s.hour = c.hour
      LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
      WHERE gl_in(c.hour)
      GROUP BY c.hour, c.key) d
JOIN up_count c ON c.sh = d.sh AND c.hour = d.hour;
CREATE OR REPLACE TEMP MACRO gl_mig() AS TABLE
SELECT k.hour, k.key, k.sec, c.* EXCLUDE (hour, key, sh, value, series)
FROM (SELECT c.hour, c.key, arg_max(c.sh, gl_w(c.value, c.sh)) AS sh,
             sum(c.value * coalesce(sp.seconds, getvariable('gl_dflt'))) AS sec
      FROM mig_count c
      LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
      WHERE gl_in(c.hour)
      GROUP BY c.hour, c.key) k
JOIN mig_count c ON c.sh = k.sh AND c.hour = k.hour;
CREATE OR REPLACE TEMP MACRO gl_allocation() AS TABLE
SELECT k.hour, k.key, k.units, k.sec, c.* EXCLUDE (hour, key, sh, value, series)
FROM (SELECT c.hour, c.key, arg_max(c.sh, gl_w(c.value, c.sh)) AS sh,
             sum(coalesce(s.value, 0)) / sum(c.value) AS units,
             sum(c.value * coalesce(sp.seconds, getvariable('gl_dflt'))) AS sec
      FROM alloc_count c
      LEFT JOIN alloc_sum s ON s.sh = c.sh AND s.hour = c.hour
      LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
      WHERE gl_in(c.hour)
      GROUP BY c.hour, c.key) k
JOIN alloc_count c ON c.sh = k.sh AND c.hour = k.hour;
CREATE OR REPLACE TEMP MACRO gl_holder() AS TABLE
SELECT c.* EXCLUDE (sh, value, series)
FROM (SELECT hour, key, arg_max(sh, gl_w(value, sh)) AS sh FROM alloc_count
      WHERE gl_in(hour) GROUP BY hour, key) k
JOIN alloc_count c ON c.sh = k.sh AND c.hour = k.hour;

-- query: pick_single
-- pick_grouped when no key has two series: each (hour, key) has one row of its count signal,
-- which names it, so there is nothing to group and no row to join back (a group-by and a join
-- of every device-hour and allocation-hour saved: docs/performance.md, "Facts without needless
-- work"). The sums of one value are that value: the same facts, bit for bit.
CREATE OR REPLACE TEMP MACRO gl_device() AS TABLE
SELECT c.hour, c.key, c.value * coalesce(sp.seconds, getvariable('gl_dflt')) AS obs,
       coalesce(s.value, 0) * coalesce(sp.seconds, getvariable('gl_dflt')) AS up,
       c.cluster, c.node, c.gpu, c.uuid, c.model
FROM up_count c
LEFT JOIN up_sum s ON s.sh = c.sh AND s.hour = c.hour
LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
WHERE gl_in(c.hour);
CREATE OR REPLACE TEMP MACRO gl_mig() AS TABLE
SELECT c.hour, c.key, c.value * coalesce(sp.seconds, getvariable('gl_dflt')) AS sec,
       c.* EXCLUDE (hour, key, sh, value, series)
FROM mig_count c
LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
WHERE gl_in(c.hour);
CREATE OR REPLACE TEMP MACRO gl_allocation() AS TABLE
SELECT c.hour, c.key, coalesce(s.value, 0) / c.value AS units,
       c.value * coalesce(sp.seconds, getvariable('gl_dflt')) AS sec,
       c.* EXCLUDE (hour, key, sh, value, series)
FROM alloc_count c
LEFT JOIN alloc_sum s ON s.sh = c.sh AND s.hour = c.hour
LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
WHERE gl_in(c.hour);
CREATE OR REPLACE TEMP MACRO gl_holder() AS TABLE
SELECT * EXCLUDE (sh, value, series) FROM alloc_count WHERE gl_in(hour);

-- query: agg_rows
-- Per series and hour, what the per-key aggregates (agg_grouped, agg_single) add up: a sum
-- signal's integral (value x seconds per sample of its node) in the signal table `t`...
CREATE OR REPLACE TEMP MACRO gl_integrand(t) AS TABLE
SELECT hour, key, value * coalesce(seconds, getvariable('gl_dflt')) AS v
FROM query_table(t) LEFT JOIN spacing USING (cluster, node)
WHERE gl_in(hour);
-- ... and an energy counter's increase: last value of the hour minus last value of the hour
-- before (a drop is a counter reset: count from zero); with no hour before, last minus first
-- of the hour. A reset within the hour (last < first) counts from zero too.
CREATE OR REPLACE TEMP MACRO gl_increase() AS TABLE
SELECT l.hour, l.key,
       CASE WHEN p.value IS NULL AND l.value >= m.value THEN l.value - m.value
            WHEN p.value IS NULL THEN l.value
            WHEN l.value >= p.value THEN l.value - p.value
            ELSE l.value END AS j,
       l.value < coalesce(p.value, m.value) AS reset
FROM energy_last l
LEFT JOIN energy_last p ON p.sh = l.sh AND p.hour = l.hour - INTERVAL 1 HOUR
LEFT JOIN energy_min m ON m.sh = l.sh AND m.hour = l.hour
WHERE gl_in(l.hour);

-- query: agg_grouped
-- The other signals per fact row (hour, key), summed (integrals, energy), maxed (peaks) or
-- combined (info) over the key's series: what the fact steps join to the picked rows. Run
-- after agg_rows, before the fact steps, when some signal of the node group has a key with
-- two series (metering/facts.py), agg_single otherwise; both define gl_integral(t),
-- gl_peak(t), gl_info() and gl_energy() with the same columns.
CREATE OR REPLACE TEMP MACRO gl_integral(t) AS TABLE
SELECT hour, key, sum(v) AS v FROM gl_integrand(t) GROUP BY hour, key;
CREATE OR REPLACE TEMP MACRO gl_peak(t) AS TABLE
SELECT hour, key, max(value) AS v FROM query_table(t) WHERE gl_in(hour) GROUP BY hour, key;
CREATE OR REPLACE TEMP MACRO gl_info() AS TABLE
SELECT hour, key, bool_or(lower(mig_mode) IN ('enabled', 'true', '1', 'on')) AS mig,
       -- no vendor label (exporters before it): NVIDIA, the only vendor they read
       max(nullif(lower(trim(vendor)), '')) AS vendor
FROM info_count WHERE gl_in(hour) GROUP BY hour, key;
CREATE OR REPLACE TEMP MACRO gl_energy() AS TABLE
SELECT hour, key, sum(j) AS j, bool_or(reset) AS reset FROM gl_increase() GROUP BY hour, key;

-- query: agg_single
-- agg_grouped when every key of every signal has one series: each (hour, key) has one row
-- per signal, which is its aggregate, so there is nothing to group (a hash aggregate per
-- signal saved: docs/performance.md, "No grouping where no key has two series"). The sum,
-- max and bool_or of one value are that value: the same facts, bit for bit.
CREATE OR REPLACE TEMP MACRO gl_integral(t) AS TABLE FROM gl_integrand(t);
CREATE OR REPLACE TEMP MACRO gl_peak(t) AS TABLE
SELECT hour, key, value AS v FROM query_table(t) WHERE gl_in(hour);
CREATE OR REPLACE TEMP MACRO gl_info() AS TABLE
SELECT hour, key, lower(mig_mode) IN ('enabled', 'true', '1', 'on') AS mig,
       nullif(lower(trim(vendor)), '') AS vendor
FROM info_count WHERE gl_in(hour);
CREATE OR REPLACE TEMP MACRO gl_energy() AS TABLE FROM gl_increase();

-- step: device_hours
INSERT INTO device_hours (hour, cluster, node, gpu, uuid, model, mig_enabled, observed_seconds,
                          up_seconds, sm_active_seconds, energy_joules, energy_estimated,
                          vendor)
SELECT d.hour, d.cluster, d.node, d.gpu, d.uuid, d.model, coalesce(i.mig, false),
       gl_sec(d.obs, h.u), d.up * gl_scale(d.obs, h.u),
       CASE WHEN coalesce(i.mig, false) THEN NULL ELSE u.v * gl_scale(d.obs, h.u) END,
       -- the counter's increase; where it is missing or reset, the power integral (a reset
       -- loses the joules before it), flagged; a reset without power samples keeps the
       -- counter's (low) figure, flagged too. Neither: NULL, unknown.
       CASE WHEN e.j IS NOT NULL AND NOT e.reset THEN e.j
            ELSE coalesce(w.v, e.j) END * gl_scale(d.obs, h.u),
       (e.j IS NULL AND w.v IS NOT NULL) OR coalesce(e.reset, false),
       coalesce(i.vendor, 'nvidia')
FROM gl_device() d
LEFT JOIN _held h ON h.fam = 'device' AND h.hour = d.hour AND h.key = d.key
LEFT JOIN gl_info() i ON i.hour = d.hour AND i.key = d.key
LEFT JOIN gl_integral('util_sum') u ON u.hour = d.hour AND u.key = d.key
LEFT JOIN gl_energy() e ON e.hour = d.hour AND e.key = d.key
LEFT JOIN gl_integral('power_sum') w ON w.hour = d.hour AND w.key = d.key;

-- step: mig_hours
INSERT INTO mig_hours (hour, cluster, node, uuid, mig_uuid, profile, slices, parent_slices,
                       memory_total_bytes, observed_seconds, sm_active_seconds)
WITH gpm AS (
    -- NULL (no row) when the hour has no GPM sample for the instance: unknown, not idle.
    SELECT g.hour, g.key, sum(g.value * coalesce(sp.seconds, getvariable('gl_dflt'))) AS v
    FROM gpm_sum g LEFT JOIN spacing sp ON sp.cluster = g.cluster AND sp.node = g.node
    WHERE gl_in(g.hour) AND g.mig_uuid <> '' GROUP BY g.hour, g.key)
SELECT k.hour, k.cluster, k.node, k.uuid, k.mig_uuid, k.profile, CAST(k.slices AS INTEGER),
       CAST(k.parent_slices AS INTEGER), mem.v,
       gl_sec(k.sec, h.u), gpm.v * gl_scale(k.sec, h.u)
FROM gl_mig() k
LEFT JOIN _held h ON h.fam = 'mig' AND h.hour = k.hour AND h.key = k.key
LEFT JOIN gl_peak('migmem_max') mem ON mem.hour = k.hour AND mem.key = k.key
LEFT JOIN gpm ON gpm.hour = k.hour AND gpm.key = k.key;

-- step: allocation_hours
INSERT INTO allocation_hours (hour, cluster, node, namespace, pod, container, uuid, mig_uuid,
                              resource, sharing, replicas, units, allocated_seconds,
                              memory_byte_seconds, sm_seconds, labels)
SELECT k.hour, k.cluster, k.node, k.namespace, k.pod, k.container, k.uuid, k.mig_uuid,
       k.resource, k.sharing, CAST(k.replicas AS INTEGER), k.units, gl_sec(k.sec, h.u),
       coalesce(mem.v, 0) * gl_scale(k.sec, h.u),
       -- NULL without samples (MIG: NVML has no per-process SM there): unknown, not idle.
       sm.v * gl_scale(k.sec, h.u), k.labels
FROM gl_allocation() k
LEFT JOIN _held h ON h.fam = 'alloc' AND h.hour = k.hour AND h.key = k.key
LEFT JOIN gl_integral('cmem_sum') mem ON mem.hour = k.hour AND mem.key = k.key
LEFT JOIN gl_integral('csm_sum') sm ON sm.hour = k.hour AND sm.key = k.key;

-- step: workload_hours
-- Per allocation fact: the pod's owner (from the series that names the fact row) and the
-- peak memory of the hour (max over duplicate series too: a duplicate cannot raise a peak).
INSERT INTO workload_hours (hour, cluster, namespace, pod, container, uuid, mig_uuid,
                            owner_kind, owner_name, memory_max_bytes)
SELECT k.hour, k.cluster, k.namespace, k.pod, k.container, k.uuid, k.mig_uuid, k.owner_kind,
       k.owner_name, mx.v
FROM gl_holder() k
LEFT JOIN gl_peak('cmem_max') mx ON mx.hour = k.hour AND mx.key = k.key;

-- step: grant_hours
-- Per allocation fact with a fractional grant: the granted memory and core fractions (the
-- largest seen in the hour; NULL where the grant gives none, e.g. no core limit).
INSERT INTO grant_hours (hour, cluster, namespace, pod, container, uuid, mig_uuid,
                         memory_fraction, core_fraction)
SELECT k.hour, k.cluster, k.namespace, k.pod, k.container, k.uuid, k.mig_uuid,
       -- clamped to 0-1; greatest() would turn a missing figure (NULL) into 0
       CASE WHEN m.v IS NOT NULL THEN least(greatest(m.v, 0), 1) END,
       CASE WHEN cf.v IS NOT NULL THEN least(greatest(cf.v, 0), 1) END
FROM gl_holder() k
LEFT JOIN gl_peak('cmemfrac_max') m ON m.hour = k.hour AND m.key = k.key
LEFT JOIN gl_peak('ccorefrac_max') cf ON cf.hour = k.hour AND cf.key = k.key
WHERE m.v IS NOT NULL OR cf.v IS NOT NULL;

-- query: signal_seconds
-- Per (cluster, hour): sample-seconds a node group's device, MIG and allocation signals hold.
-- Minus the facts' seconds (fact_seconds, once the chunk's groups are written), that is what
-- de-duplication removed.
SELECT cluster, hour, sum(s) FROM (
    SELECT c.cluster, c.hour, c.value * coalesce(sp.seconds, getvariable('gl_dflt')) AS s
    FROM up_count c LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
    WHERE gl_in(c.hour)
    UNION ALL
    SELECT c.cluster, c.hour, c.value * coalesce(sp.seconds, getvariable('gl_dflt'))
    FROM mig_count c LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
    WHERE gl_in(c.hour)
    UNION ALL
    SELECT c.cluster, c.hour, c.value * coalesce(sp.seconds, getvariable('gl_dflt'))
    FROM alloc_count c LEFT JOIN spacing sp ON sp.cluster = c.cluster AND sp.node = c.node
    WHERE gl_in(c.hour))
GROUP BY cluster, hour;

-- query: fact_seconds
-- Per (cluster, hour): the seconds the chunk's device, MIG and allocation facts hold.
SELECT cluster, hour, sum(s) FROM (
    SELECT cluster, hour, observed_seconds AS s FROM device_hours WHERE gl_in(hour)
    UNION ALL SELECT cluster, hour, observed_seconds FROM mig_hours WHERE gl_in(hour)
    UNION ALL SELECT cluster, hour, allocated_seconds FROM allocation_hours WHERE gl_in(hour))
GROUP BY cluster, hour;

-- query: cleanup
-- Run after the steps, whether they succeeded or not.
DROP TABLE IF EXISTS _spans;
DROP TABLE IF EXISTS _held;

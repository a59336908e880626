-- GPU Ledger facts and charges. All times are UTC; `hour` is the start of the hour.
-- Ingest owns the fact tables and writes them idempotently (delete the chunk's hours, insert,
-- in one transaction). Pricing owns `charges` and rebuilds it for a period.
-- The fact tables have no PRIMARY KEY: each ingest statement groups by the key it writes,
-- and delete-then-insert per chunk keeps it unique (tests/test_ingest_idempotent.py). The
-- keys' indexes cost more than half of an ingest's write time and slowed every delete;
-- metering/db.py rebuilds tables of earlier versions without them. Keys, for the record:
-- device_hours (hour, uuid); mig_hours (hour, mig_uuid);
-- allocation_hours (hour, namespace, pod, container, uuid, mig_uuid); each within a `cluster`.
--
-- `cluster` (every table): the Kubernetes cluster the row belongs to (docs/metering.md,
-- "Many clusters"). Added after the first release, so it is the last column and defaults to
-- 'default', the cluster of every single-cluster ledger (facts.DEFAULT_CLUSTER).

CREATE TABLE IF NOT EXISTS device_hours (
    hour              TIMESTAMP NOT NULL,
    node              VARCHAR   NOT NULL,
    gpu               VARCHAR   NOT NULL,   -- index on the node, as the exporter labels it
    uuid              VARCHAR   NOT NULL,
    model             VARCHAR   NOT NULL,
    mig_enabled       BOOLEAN   NOT NULL,
    observed_seconds  DOUBLE    NOT NULL,   -- samples of gpu_up in the hour x sample spacing
    up_seconds        DOUBLE    NOT NULL,   -- of which gpu_up == 1
    sm_active_seconds DOUBLE,               -- integral of gpu_utilization_ratio (NULL on MIG)
    energy_joules     DOUBLE,               -- increase of gpu_energy_joules_total
    cluster           VARCHAR   NOT NULL DEFAULT 'default',
    -- energy_joules is the integral of gpu_power_watts, not the counter's increase: the
    -- counter was missing or reset in the hour (docs/cost-model.md, "Energy and carbon").
    -- Added later: last, as migrations append it.
    energy_estimated  BOOLEAN   NOT NULL DEFAULT false,
    -- who made it (gpu_info's `vendor` label: nvidia | amd | intel); rows of exporters that had
    -- no such label are NVIDIA's. Added later: last, as migrations append it.
    vendor            VARCHAR   NOT NULL DEFAULT 'nvidia'
);

CREATE TABLE IF NOT EXISTS mig_hours (
    hour              TIMESTAMP NOT NULL,
    node              VARCHAR   NOT NULL,
    uuid              VARCHAR   NOT NULL,   -- parent GPU
    mig_uuid          VARCHAR   NOT NULL,
    profile           VARCHAR   NOT NULL,   -- e.g. 3g.40gb; an AMD partition: cpx_nps4
    slices            INTEGER   NOT NULL,   -- compute slices of the profile
    parent_slices     INTEGER   NOT NULL,
    memory_total_bytes DOUBLE,
    observed_seconds  DOUBLE    NOT NULL,
    -- integral of gpu_sm_active_ratio (GPM, Hopper+) of the instance; NULL without samples
    -- (no GPM, e.g. A100): unknown, not idle. Added later: last, as migrations append it.
    sm_active_seconds DOUBLE,
    cluster           VARCHAR   NOT NULL DEFAULT 'default'
);

CREATE TABLE IF NOT EXISTS allocation_hours (
    hour              TIMESTAMP NOT NULL,
    node              VARCHAR   NOT NULL,
    namespace         VARCHAR   NOT NULL,
    pod               VARCHAR   NOT NULL,
    container         VARCHAR   NOT NULL,
    uuid              VARCHAR   NOT NULL,
    mig_uuid          VARCHAR   NOT NULL,   -- '' for a whole (or time-sliced) GPU
    resource          VARCHAR   NOT NULL,   -- e.g. nvidia.com/gpu, nvidia.com/mig-3g.40gb
    sharing           VARCHAR   NOT NULL,   -- exclusive | mig | time-slicing | mps | fractional | ...
    replicas          INTEGER   NOT NULL,   -- shares the device is cut into (1 if exclusive)
    units             DOUBLE    NOT NULL,   -- shares of the device this container holds (avg)
    allocated_seconds DOUBLE    NOT NULL,   -- samples of gpu_container_allocation x spacing
    memory_byte_seconds DOUBLE  NOT NULL,   -- integral of gpu_container_memory_used_bytes
    sm_seconds        DOUBLE,               -- integral of gpu_container_sm_utilization_ratio;
                                            -- NULL without samples (MIG): unknown, not idle
    labels            MAP(VARCHAR, VARCHAR) NOT NULL,  -- label_<name> pod labels, name without prefix
    cluster           VARCHAR   NOT NULL DEFAULT 'default'
);

-- Per allocation fact (same key as allocation_hours): who owns the pod and its peak memory,
-- for waste recommendations (metering/report/waste.py). A table of its own so allocation_hours, which
-- pricing reads, keeps its shape.
CREATE TABLE IF NOT EXISTS workload_hours (
    hour              TIMESTAMP NOT NULL,
    namespace         VARCHAR   NOT NULL,
    pod               VARCHAR   NOT NULL,
    container         VARCHAR   NOT NULL,
    uuid              VARCHAR   NOT NULL,
    mig_uuid          VARCHAR   NOT NULL,
    owner_kind        VARCHAR   NOT NULL,   -- the pod's controller: Deployment, Job, ...; '' if none
    owner_name        VARCHAR   NOT NULL,
    memory_max_bytes  DOUBLE,               -- max of gpu_container_memory_used_bytes in the hour;
                                            -- NULL without samples: unknown
    cluster           VARCHAR   NOT NULL DEFAULT 'default'
);

-- Per allocation fact (same key as allocation_hours) of a fractional grant (HAMi, gpushare):
-- the fraction of the device's memory and compute the scheduler granted, 0-1; NULL where the
-- grant gives none (gpushare and unlimited HAMi cores have no core fraction). Pricing reads it
-- for sharing 'fractional' (cost model `sharing.fractional`). A table of its own so
-- allocation_hours keeps its shape.
CREATE TABLE IF NOT EXISTS grant_hours (
    hour              TIMESTAMP NOT NULL,
    namespace         VARCHAR   NOT NULL,
    pod               VARCHAR   NOT NULL,
    container         VARCHAR   NOT NULL,
    uuid              VARCHAR   NOT NULL,
    mig_uuid          VARCHAR   NOT NULL,
    memory_fraction   DOUBLE,
    core_fraction     DOUBLE,
    cluster           VARCHAR   NOT NULL DEFAULT 'default'
);

-- One row per hour and cluster that an ingest covered; hours of the period absent here had no data.
CREATE TABLE IF NOT EXISTS coverage (
    hour              TIMESTAMP NOT NULL,
    source            VARCHAR   NOT NULL,   -- prometheus URL or openmetrics file
    devices           INTEGER   NOT NULL,   -- devices seen in the hour (0 = no data)
    ingested_at       TIMESTAMP NOT NULL,
    -- sample-seconds (device, MIG, allocation) counted once instead of twice or more:
    -- overlapping duplicate series (docs/metering.md, "Several series for one key")
    duplicate_seconds DOUBLE    DEFAULT 0,
    dropped_values    BIGINT    DEFAULT 0,  -- NaN, Inf, non-numbers, out of range: not priced
    cluster           VARCHAR   NOT NULL DEFAULT 'default',
    PRIMARY KEY (hour, cluster)
);

-- The cost models that priced `charges` (charges.cost_model_hash = hash), written by pricing
-- in the same transaction as the charges: with them a report made from the ledger alone
-- states the cost model's name, hash and currency, its prices and its budgets.
CREATE TABLE IF NOT EXISTS cost_models (
    hash              VARCHAR   NOT NULL PRIMARY KEY,  -- sha256 of the file's bytes
    name              VARCHAR   NOT NULL,   -- the file as given to meter (or the packaged default)
    currency          VARCHAR   NOT NULL,
    document          VARCHAR   NOT NULL,   -- the file's text, read back by reports
    priced_at         TIMESTAMP NOT NULL    -- last pricing run that used it (UTC)
);

-- The device-hour list price each GPU model was charged at, per cost model.
CREATE TABLE IF NOT EXISTS cost_model_prices (
    cost_model_hash   VARCHAR   NOT NULL,
    model             VARCHAR   NOT NULL,   -- GPU model as NVML names it
    hourly            DECIMAL(18, 6) NOT NULL,  -- list price per device-hour, before discounts
    discount          DOUBLE    NOT NULL,   -- model discount (0-1)
    rule              VARCHAR   NOT NULL,   -- the pricing entry that set it, e.g. pricing.gpus[1]
    PRIMARY KEY (cost_model_hash, model)
);

-- Priced rows: per hour x team x namespace x pod x device, rebuilt per period by pricing
-- (docs/cost-model.md). Besides team rows, the engine writes rows it owns, told apart by
-- `sharing`: 'idle' (team 'idle': up but unheld, one per device-hour), 'down' (team 'down': the
-- part of a device-hour the GPU was not up, never charged to a team), 'adjustment' (team
-- 'adjustment', per hour x model: list price given away by discounts, tiers, efficiency
-- factors; may be negative). Under idle policy proportional/even, team rows carry
-- idle_share > 0 (included in cost); under policy weights, idle-share rows have the paying
-- team, sharing 'idle', basis 'idle-share' and no pod/device. Per hour x model, sum(cost) over
-- all rows = the fleet's device-hour cost, exactly.
CREATE TABLE IF NOT EXISTS charges (
    hour              TIMESTAMP NOT NULL,
    team              VARCHAR   NOT NULL,
    namespace         VARCHAR   NOT NULL,   -- '' for idle
    pod               VARCHAR   NOT NULL,   -- '' for idle
    container         VARCHAR   NOT NULL,
    node              VARCHAR   NOT NULL,
    uuid              VARCHAR   NOT NULL,
    mig_uuid          VARCHAR   NOT NULL,
    model             VARCHAR   NOT NULL,
    sharing           VARCHAR   NOT NULL,   -- exclusive | mig | time-slicing | mps | fractional | idle | down | adjustment
    profile           VARCHAR   NOT NULL,   -- MIG profile or ''
    basis             VARCHAR   NOT NULL,   -- allocation | usage | blend | idle | idle-share | down | adjustment | allocation (no SM data on MIG) | allocation (no SM data)
    fraction          DOUBLE    NOT NULL,   -- share of the device-hour charged to this row
    rate              DOUBLE    NOT NULL,   -- device-hour price used (after discounts, tiers, factors); cost - idle_share ≈ rate x fraction
    allocated_gpu_hours DOUBLE  NOT NULL,   -- device-equivalent hours allocated
    used_gpu_hours    DOUBLE,               -- device-equivalent hours of SM activity; NULL: unknown
                                            -- (MIG without GPM, no SM samples)
    cost              DECIMAL(18, 6) NOT NULL,
    idle_share        DECIMAL(18, 6) NOT NULL, -- part of cost that is shared-out idle
    cost_model_hash   VARCHAR   NOT NULL,
    cluster           VARCHAR   NOT NULL DEFAULT 'default'
);

-- Each priced device-hour's energy split among its holders, rebuilt with `charges` by pricing
-- (docs/cost-model.md, "Energy and carbon"). Per device-hour with a known energy_joules, the
-- rows' energy_joules add up to the device's, exactly (integer millijoules), and so do
-- energy_cost and co2e_grams to the device-hour's (integer micros, milligrams). team 'idle'
-- (sharing 'idle'): the energy the holders' share leaves (no holder, or SMs not busy);
-- team 'down' (sharing 'down'): the part of the hour the device was not up, by time.
CREATE TABLE IF NOT EXISTS energy_hours (
    hour              TIMESTAMP NOT NULL,
    team              VARCHAR   NOT NULL,
    namespace         VARCHAR   NOT NULL,   -- '' for idle, down
    pod               VARCHAR   NOT NULL,
    container         VARCHAR   NOT NULL,
    node              VARCHAR   NOT NULL,
    uuid              VARCHAR   NOT NULL,
    mig_uuid          VARCHAR   NOT NULL,
    model             VARCHAR   NOT NULL,
    sharing           VARCHAR   NOT NULL,   -- the holder's mode, or idle | down
    profile           VARCHAR   NOT NULL,   -- MIG profile or ''
    rule              VARCHAR   NOT NULL,   -- held | mig-activity | mig-slices | sm-share |
                                            -- held (no SM data) | idle | down
    fraction          DOUBLE    NOT NULL,   -- share of the device-hour's energy
    energy_joules     DECIMAL(18, 3) NOT NULL,
    estimated         BOOLEAN   NOT NULL,   -- the device-hour's energy came from power samples
    price_per_kwh     DECIMAL(18, 6),       -- NULL: the cost model has no `energy:`
    energy_cost       DECIMAL(18, 6),       -- kWh x PUE x price_per_kwh; NULL: not priced
    co2e_grams        DECIMAL(18, 3),       -- kWh x PUE x gCO2e/kWh; NULL: no `carbon:`
    cost_model_hash   VARCHAR   NOT NULL,
    cluster           VARCHAR   NOT NULL DEFAULT 'default'
);

-- Ingest runs and the chunks each committed (metering/resume.py): a run that stopped before
-- its last chunk (killed, Prometheus down) is resumed after its committed chunks. A chunk's
-- row is written in the chunk's own transaction, so it exists exactly when its facts do.
CREATE TABLE IF NOT EXISTS ingest_runs (
    run_id            BIGINT    NOT NULL,
    source            VARCHAR   NOT NULL,
    period_start      TIMESTAMP NOT NULL,   -- UTC
    period_end        TIMESTAMP NOT NULL,
    started_at        TIMESTAMP NOT NULL,
    finished_at       TIMESTAMP,            -- NULL: stopped before its last chunk
    settings          VARCHAR   NOT NULL DEFAULT ''  -- selector, clusters, chunk, interval
);

CREATE TABLE IF NOT EXISTS ingest_chunks (
    run_id            BIGINT    NOT NULL,
    chunk_start       TIMESTAMP NOT NULL,
    chunk_end         TIMESTAMP NOT NULL,
    committed_at      TIMESTAMP NOT NULL,
    clusters          VARCHAR[]             -- the clusters it rewrote; NULL: not recorded
);

-- Hours a run is writing straight into the ledger's tables, committing as it goes
-- (metering/unfinished.py): a chunk's node groups into the fact tables, or a period's pricing
-- slices into the charges, energy and waste tables; hours that held no such rows before it,
-- or (`repriced`) whose old pricing rows it copied into tables aside_<table> first.
-- While a row is here they hold part of them: a writable open of the ledger deletes them (puts
-- back what is aside, drops the row), a reader refuses the ledger. The run's last transaction
-- deletes the row and drops the aside_ tables.
CREATE TABLE IF NOT EXISTS unfinished_hours (
    hour_start        TIMESTAMP NOT NULL,   -- UTC
    hour_end          TIMESTAMP NOT NULL,
    clusters          VARCHAR[],            -- NULL: every cluster (a cluster label's chunk)
    written           VARCHAR   NOT NULL DEFAULT 'facts'  -- facts | charges | repriced
);

-- Closed months (metering/closes.py, `gpu-ledger close`): a closed month's charges never
-- change again. What data metered after the close changes in its hours is appended to
-- `adjustments` and billed in the first open month after it (docs/metering.md, "Closing a
-- month").
CREATE TABLE IF NOT EXISTS month_closes (
    month             DATE      NOT NULL PRIMARY KEY,  -- first day of the month
    closed_at         TIMESTAMP NOT NULL,   -- UTC
    cost              DECIMAL(18, 6) NOT NULL,  -- the closed bill: its charges' cost
    device_hours      BIGINT    NOT NULL
);

-- Per hour of a closed month x cluster x team x namespace: how much later data changed the
-- cost (may be negative). Appended, never rewritten: the sum over an hour's rows is what its
-- charges would be now, less what the closed bill says.
CREATE TABLE IF NOT EXISTS adjustments (
    hour              TIMESTAMP NOT NULL,   -- the closed month's hour the usage was in
    cluster           VARCHAR   NOT NULL,
    team              VARCHAR   NOT NULL,
    namespace         VARCHAR   NOT NULL,
    cost              DECIMAL(18, 6) NOT NULL,
    allocated_gpu_hours DOUBLE  NOT NULL,
    posted_month      DATE      NOT NULL,   -- the open month that bills it
    posted_at         TIMESTAMP NOT NULL,   -- UTC
    cost_model_hash   VARCHAR   NOT NULL
);

-- Waste recommendations' device-hours (metering/report/waste.py, waste.sql `device_hours`),
-- stored by pricing for the hours it prices, so that the month-end report reads them instead
-- of joining the month's facts with its charges again. Derived: every row is what that query
-- gives for its hour and cluster from the facts and charges as they are now. Pricing replaces
-- an hour x cluster's rows in its transaction (after closed hours' charges are restored:
-- metering/closes.py); rewriting facts that come out different (metering/pricedhours.py
-- settle) or merging a cluster-month (metering/export.py) deletes them, and the report
-- computes such hours again.
-- Columns: the query's, in its order and types.
CREATE TABLE IF NOT EXISTS waste_hours (
    cluster           VARCHAR   NOT NULL,
    namespace         VARCHAR   NOT NULL,
    owner_kind        VARCHAR   NOT NULL,
    owner_name        VARCHAR   NOT NULL,
    model             VARCHAR   NOT NULL,
    sharing           VARCHAR   NOT NULL,
    profile           VARCHAR   NOT NULL,
    hour              TIMESTAMP NOT NULL,
    held_h            DOUBLE,
    mem_max           DOUBLE,
    sm                DOUBLE,
    team              VARCHAR,
    cost              DECIMAL(38, 6),
    idle              BOOLEAN,
    joules            DECIMAL(38, 3),
    grams             DECIMAL(38, 3)
);

-- The hours x clusters whose waste_hours rows are stored (none may be: an hour with no
-- holder). An hour with facts and no row here is computed by the report from the facts.
CREATE TABLE IF NOT EXISTS waste_hours_stored (
    hour              TIMESTAMP NOT NULL,
    cluster           VARCHAR   NOT NULL,
    stored_at         TIMESTAMP NOT NULL    -- UTC
);

-- The hours x clusters pricing wrote, with what it priced them from (metering/pricedhours.py):
-- `meter` does not price again an hour whose facts, cost model, energy factors and pricing code
-- are the same.
CREATE TABLE IF NOT EXISTS priced_hours (
    hour                 TIMESTAMP NOT NULL,
    cluster              VARCHAR   NOT NULL,
    cost_model_hash      VARCHAR   NOT NULL,
    pricing              VARCHAR   NOT NULL,   -- the pricing code's fingerprint and a digest of
                                               -- the hour's kWh price, PUE, gCO2e/kWh
    facts                VARCHAR   NOT NULL,   -- digest of the hour's facts when priced
    charge_rows          BIGINT    NOT NULL,   -- charges rows written for the hour
    unpriced_allocations BIGINT    NOT NULL,   -- allocation facts with no device fact
    priced_at            TIMESTAMP NOT NULL    -- UTC
);

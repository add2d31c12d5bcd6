-- purser ledger on PostgreSQL, version 1: the schema SQLite reached at its version 6,
-- in PostgreSQL's own types, plus what several replicas sharing it need.
--
-- * Money is NUMERIC (exact; never a float) and times are timestamptz.
-- * Every row a replica leaves in flight names that replica (`replica`), so its rows
--   can be recovered by it at restart, or by any live replica once its lease in
--   `replicas` has expired.
-- * A request's reservation is held in the windows of the periods listed in
--   `reserved_periods`; the window of each is a function of the request's
--   `received_at`, so the row needs only the period names. NULL once settled.

CREATE TABLE requests (
    ledger_seq       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, -- commit order (see the writer)
    id               text NOT NULL UNIQUE,                -- ULID
    received_at      timestamptz NOT NULL,
    client           text NOT NULL,
    policy           text NOT NULL,
    plan_id          text NOT NULL,
    model            text NOT NULL,
    mode             text NOT NULL CHECK (mode IN ('hard', 'soft')),
    ceiling          numeric NOT NULL,
    worst_case       numeric NOT NULL CHECK (worst_case >= 0),
    outcome          text NOT NULL CHECK (outcome IN ('in_flight', 'served', 'refused', 'failed', 'interrupted')),
    error_code       text,
    served_by        text,
    cost             numeric NOT NULL DEFAULT 0,
    reserved_periods text[],                              -- periods whose window it holds
    reserved_amount  numeric CHECK (reserved_amount >= 0), -- what it holds now (NULL: worst_case)
    replica          text NOT NULL                        -- the replica that admitted it
);

CREATE TABLE attempts (
    request_id     text NOT NULL REFERENCES requests (id),
    seq            integer NOT NULL CHECK (seq >= 1),
    provider       text NOT NULL,
    upstream_model text NOT NULL,
    jurisdiction   text NOT NULL,
    started_at     timestamptz NOT NULL,
    finished_at    timestamptz,
    state          text NOT NULL CHECK (state IN ('in_flight', 'done', 'interrupted')),
    status         integer,
    class          text,                 -- 'success' or a failure class; NULL while in flight
    billing        text NOT NULL CHECK (billing IN ('billed', 'maybe_billed', 'not_billed')),
    decision       text,
    reason         text,
    input_tokens   bigint,
    output_tokens  bigint,
    cost           numeric NOT NULL DEFAULT 0,   -- billed amount (exact)
    worst_case     numeric NOT NULL,             -- what it could have cost: counted when maybe_billed
    cost_basis     text CHECK (cost_basis IN ('usage', 'worst_case', 'estimated')),
    message        text,                         -- upstream's message, truncated, secrets redacted
    replica        text NOT NULL,                -- the replica that sent it
    PRIMARY KEY (request_id, seq)
);

CREATE TABLE budget_windows (
    policy       text NOT NULL,
    period       text NOT NULL CHECK (period IN ('day', 'month')),
    window_start timestamptz NOT NULL,
    limit_amount numeric NOT NULL,
    spent        numeric NOT NULL DEFAULT 0 CHECK (spent >= 0),
    reserved     numeric NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    PRIMARY KEY (policy, period, window_start)
);

-- One row per replica id: a replica renews `expires_at` while it lives. A row whose
-- lease has expired belongs to a replica that may be dead; any live replica then
-- recovers its in-flight rows. `instance` tells two processes claiming one id apart.
CREATE TABLE replicas (
    id          text PRIMARY KEY,
    instance    text NOT NULL,
    started_at  timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- The audit API pages newest first by commit order, per policy too.
CREATE INDEX requests_by_policy ON requests (policy, ledger_seq);
-- spend and attempts.csv select attempts by start time and sum these columns.
CREATE INDEX attempts_by_start ON attempts (started_at, provider, billing, cost, worst_case);
-- Recovery finds a replica's in-flight rows without a scan; the partial indexes hold
-- only rows in flight, so they stay small.
CREATE INDEX requests_in_flight ON requests (replica) WHERE outcome = 'in_flight';
CREATE INDEX attempts_in_flight ON attempts (replica) WHERE state = 'in_flight';

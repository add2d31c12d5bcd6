-- purser ledger, version 1: requests, their attempts, and period budget windows.
-- Money is stored as exact decimal TEXT and summed with the dsum() aggregate that
-- purser registers on every connection (never floating point).

CREATE TABLE requests (
    id           TEXT PRIMARY KEY,            -- ULID
    received_at  TEXT NOT NULL,               -- RFC 3339 UTC
    received_ms  INTEGER NOT NULL,            -- same instant, for ordering and windows
    client       TEXT NOT NULL,
    policy       TEXT NOT NULL,
    plan_id      TEXT NOT NULL,
    model        TEXT NOT NULL,
    mode         TEXT NOT NULL CHECK (mode IN ('hard', 'soft')),
    ceiling      TEXT NOT NULL,
    worst_case   TEXT NOT NULL,
    outcome      TEXT NOT NULL CHECK (outcome IN ('in_flight', 'served', 'refused', 'failed', 'interrupted')),
    error_code   TEXT,
    served_by    TEXT,
    cost         TEXT NOT NULL DEFAULT '0'
);

CREATE TABLE attempts (
    request_id     TEXT NOT NULL REFERENCES requests (id),
    seq            INTEGER NOT NULL CHECK (seq >= 1),
    provider       TEXT NOT NULL,
    upstream_model TEXT NOT NULL,
    jurisdiction   TEXT NOT NULL,
    started_at     TEXT NOT NULL,
    finished_at    TEXT,
    state          TEXT NOT NULL CHECK (state IN ('in_flight', 'done', 'interrupted')),
    status         INTEGER,
    class          TEXT,                       -- 'success' or a failure class; NULL while in flight
    billing        TEXT NOT NULL CHECK (billing IN ('billed', 'maybe_billed', 'not_billed')),
    decision       TEXT,
    reason         TEXT,
    input_tokens   INTEGER,
    output_tokens  INTEGER,
    cost           TEXT NOT NULL DEFAULT '0',  -- billed amount (exact)
    worst_case     TEXT NOT NULL,              -- what it could have cost: counted when maybe_billed
    message        TEXT,                       -- upstream's message, truncated, secrets redacted
    PRIMARY KEY (request_id, seq)
);

CREATE TABLE budget_windows (
    policy       TEXT NOT NULL,
    period       TEXT NOT NULL CHECK (period IN ('day', 'month')),
    window_start TEXT NOT NULL,
    limit_amount TEXT NOT NULL,
    spent        TEXT NOT NULL DEFAULT '0',
    reserved     TEXT NOT NULL DEFAULT '0',
    PRIMARY KEY (policy, period, window_start)
);

CREATE TABLE reservations (
    request_id   TEXT NOT NULL REFERENCES requests (id),
    policy       TEXT NOT NULL,
    period       TEXT NOT NULL,
    window_start TEXT NOT NULL,
    amount       TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('held', 'settled', 'interrupted')),
    PRIMARY KEY (request_id, period)
);

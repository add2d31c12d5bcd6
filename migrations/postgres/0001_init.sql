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

-- Admission of one group of requests, in the order given. Every budget change is one
-- conditional statement: PostgreSQL locks the window row and checks
-- `spent + reserved + amount <= limit` on its newest version, so replicas sharing a
-- window can never together pass its limit, and nothing is read first and written
-- after.
--
-- First, each window the group touches is asked for the sum of the group's worst cases
-- at once: far from the limit every window takes it, and the whole group is admitted
-- in one statement per window. Otherwise what was taken is given back and the requests
-- go one by one: a request is admitted only if every window of its own took it, and
-- when a later window refuses, what the earlier ones took is given back at once.
--
-- Windows come flattened and grouped by request: `w_req[k]` is the (1-based) request
-- that window k belongs to. Answers, per request, NULL when admitted, or the period of
-- the window that refused it with that window's spent and reserved amounts then.
CREATE FUNCTION purser_reserve(
    p_policy text, p_period text, p_start timestamptz, p_limit numeric, p_amount numeric
) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE budget_windows w SET reserved = w.reserved + p_amount, limit_amount = p_limit
    WHERE w.policy = p_policy AND w.period = p_period AND w.window_start = p_start
      AND w.spent + w.reserved + p_amount <= p_limit;
    IF FOUND THEN
        RETURN true;
    END IF;
    -- No row, or no room: a window seen for the first time is created holding the
    -- amount (when it fits at all); a concurrent creation makes this the update above.
    INSERT INTO budget_windows AS w (policy, period, window_start, limit_amount, spent, reserved)
    SELECT p_policy, p_period, p_start, p_limit, 0, p_amount WHERE p_amount <= p_limit
    ON CONFLICT (policy, period, window_start) DO UPDATE
        SET reserved = w.reserved + excluded.reserved, limit_amount = excluded.limit_amount
        WHERE w.spent + w.reserved + excluded.reserved <= excluded.limit_amount;
    RETURN FOUND;
END
$$;

CREATE FUNCTION purser_unreserve(
    p_policy text, p_period text, p_start timestamptz, p_amount numeric
) RETURNS void LANGUAGE sql AS $$
    UPDATE budget_windows w SET reserved = w.reserved - p_amount
    WHERE w.policy = p_policy AND w.period = p_period AND w.window_start = p_start
$$;

CREATE FUNCTION purser_admit(
    r_policy text[], r_worst numeric[],
    w_req integer[], w_period text[], w_start timestamptz[], w_limit numeric[],
    OUT refused text[], OUT spent numeric[], OUT reserved numeric[]
) LANGUAGE plpgsql AS $$
DECLARE
    whole record;
    -- The windows that took the group's sum, to give it back if another did not.
    t_policy text[] := '{}';
    t_period text[] := '{}';
    t_start timestamptz[] := '{}';
    t_amount numeric[] := '{}';
    all_fit boolean := true;
    at_spent numeric;
    at_reserved numeric;
    first integer := 1; -- the current request's first window
    i integer;
BEGIN
    refused := array_fill(NULL::text, ARRAY[coalesce(cardinality(r_policy), 0)]);
    spent := array_fill(NULL::numeric, ARRAY[coalesce(cardinality(r_policy), 0)]);
    reserved := spent;
    -- The whole group at once, window by window.
    FOR whole IN
        SELECT r_policy[t.req] AS policy, t.period, t.start, min(t.lim) AS lim,
               sum(r_worst[t.req]) AS amount
        FROM unnest(w_req, w_period, w_start, w_limit) AS t (req, period, start, lim)
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    LOOP
        IF purser_reserve(whole.policy, whole.period, whole.start, whole.lim, whole.amount) THEN
            t_policy := t_policy || whole.policy;
            t_period := t_period || whole.period;
            t_start := t_start || whole.start;
            t_amount := t_amount || whole.amount;
        ELSE
            all_fit := false;
            EXIT;
        END IF;
    END LOOP;
    IF all_fit THEN
        RETURN;
    END IF;
    FOR t IN 1 .. cardinality(t_policy) LOOP
        PERFORM purser_unreserve(t_policy[t], t_period[t], t_start[t], t_amount[t]);
    END LOOP;

    -- One by one.
    FOR k IN 1 .. coalesce(cardinality(w_req), 0) LOOP
        IF k = 1 OR w_req[k] <> w_req[k - 1] THEN
            first := k;
        END IF;
        i := w_req[k];
        CONTINUE WHEN refused[i] IS NOT NULL;
        IF NOT purser_reserve(r_policy[i], w_period[k], w_start[k], w_limit[k], r_worst[i]) THEN
            refused[i] := w_period[k];
            -- The refusing window's figures, for the client's error (none: the worst
            -- case alone is over the limit, and the window was never created).
            SELECT w.spent, w.reserved INTO at_spent, at_reserved FROM budget_windows w
            WHERE w.policy = r_policy[i] AND w.period = w_period[k] AND w.window_start = w_start[k];
            spent[i] := at_spent;
            reserved[i] := at_reserved;
            FOR t IN first .. k - 1 LOOP
                PERFORM purser_unreserve(r_policy[i], w_period[t], w_start[t], r_worst[i]);
            END LOOP;
        END IF;
    END LOOP;
END
$$;

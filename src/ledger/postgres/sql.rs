//! The statements the PostgreSQL writer runs. Each budget change is one conditional
//! statement: the row is locked and its condition checked on its newest version by
//! PostgreSQL itself, so replicas sharing a window can never together pass its
//! limit, and nothing is read first and written after.
//!
//! A request's windows are named by period in `requests.reserved_periods`; the start
//! of each is `date_trunc(period, received_at, 'UTC')`, the same instant
//! `window_start_at` computes when the request is admitted.

/// Admission of a group's requests, in order (`purser_admit` in the schema reserves
/// each one's worst case with one conditional upsert per window), then each request
/// recorded as `in_flight`, or `refused` / `budget_exhausted` when a window had no
/// room, and the first attempt of each admitted one. Answers, per request, NULL when
/// admitted or the period of the window that refused it, with that window's spent and
/// reserved amounts when it refused.
///
/// Requests: $1 id, $2 received_at, $3 client, $4 policy, $5 plan_id, $6 model, $7 mode,
/// $8 ceiling, $9 worst case, $10 its periods joined by commas; $11 replica.
/// Windows, grouped by request: $12 request (1-based), $13 period, $14 start, $15 limit.
/// First attempts: $16 request (1-based), $17 request id, $18 seq, $19 provider,
/// $20 upstream model, $21 jurisdiction, $22 started_at, $23 worst case; $24 each
/// request's ingress; $25..$32 each request's shape (input bound, requested output,
/// output bound, choices, stream, tools, media, unbounded; NULL without one).
pub const ADMIT: &str = "
WITH v AS (
    SELECT * FROM purser_admit($4::text[], $9::numeric[], $12::integer[], $13::text[],
                               $14::timestamptz[], $15::numeric[])
), u AS (
    SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::numeric[], $9::numeric[], $10::text[])
        WITH ORDINALITY AS u (id, received_at, client, policy, plan_id, model, mode, ceiling,
                              worst_case, periods, n)
), r AS (
    INSERT INTO requests (id, received_at, client, policy, plan_id, model, mode, ceiling, worst_case,
                          outcome, error_code, reserved_periods, reserved_amount, replica, ingress,
                          shape_input_tokens, shape_requested_output, shape_output_bound, shape_choices,
                          shape_stream, shape_tools, shape_media, shape_unbounded)
    SELECT u.id, u.received_at, u.client, u.policy, u.plan_id, u.model, u.mode, u.ceiling, u.worst_case,
           CASE WHEN v.refused[u.n] IS NULL THEN 'in_flight' ELSE 'refused' END,
           CASE WHEN v.refused[u.n] IS NULL THEN NULL ELSE 'budget_exhausted' END,
           CASE WHEN v.refused[u.n] IS NULL AND u.periods <> '' THEN string_to_array(u.periods, ',') END,
           CASE WHEN v.refused[u.n] IS NULL AND u.periods <> '' THEN u.worst_case END,
           $11::text, ($24::text[])[u.n],
           ($25::bigint[])[u.n], ($26::bigint[])[u.n], ($27::bigint[])[u.n], ($28::bigint[])[u.n],
           ($29::boolean[])[u.n], ($30::boolean[])[u.n], ($31::boolean[])[u.n], ($32::boolean[])[u.n]
    FROM v, u ORDER BY u.n
), a AS (
    INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at,
                          state, billing, worst_case, replica)
    SELECT t.request_id, t.seq, t.provider, t.upstream_model, t.jurisdiction, t.started_at,
           'in_flight', 'maybe_billed', t.worst_case, $11::text
    FROM v, unnest($16::integer[], $17::text[], $18::integer[], $19::text[], $20::text[],
                   $21::text[], $22::timestamptz[], $23::numeric[])
        AS t (req, request_id, seq, provider, upstream_model, jurisdiction, started_at, worst_case)
    WHERE v.refused[t.req] IS NULL
)
SELECT refused, spent, reserved FROM v";

/// Take `amount` back out of the named windows' `reserved` (a partial reservation, in
/// the same transaction that made it, so no one else has seen it).
/// $1 policy, $2 periods, $3 starts, $4 amount.
pub const UNRESERVE: &str = "
UPDATE budget_windows w SET reserved = w.reserved - $4::numeric
FROM unnest($2::text[], $3::timestamptz[]) AS p (period, start)
WHERE w.policy = $1 AND w.period = p.period AND w.window_start = p.start";

/// Requests refused before any attempt. $1..$9 as in ADMIT, $10 error code, $11 replica,
/// $12 each request's ingress, $13..$20 each request's shape (as ADMIT's $25..$32).
pub const REFUSALS: &str = "
INSERT INTO requests (id, received_at, client, policy, plan_id, model, mode, ceiling, worst_case,
                      outcome, error_code, replica, ingress,
                      shape_input_tokens, shape_requested_output, shape_output_bound, shape_choices,
                      shape_stream, shape_tools, shape_media, shape_unbounded)
SELECT u.id, u.received_at, u.client, u.policy, u.plan_id, u.model, u.mode, u.ceiling, u.worst_case,
       'refused', u.error_code, $11::text, ($12::text[])[u.n],
       ($13::bigint[])[u.n], ($14::bigint[])[u.n], ($15::bigint[])[u.n], ($16::bigint[])[u.n],
       ($17::boolean[])[u.n], ($18::boolean[])[u.n], ($19::boolean[])[u.n], ($20::boolean[])[u.n]
FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::text[], $8::numeric[], $9::numeric[], $10::text[])
    WITH ORDINALITY AS u (id, received_at, client, policy, plan_id, model, mode, ceiling,
                          worst_case, error_code, n)
ORDER BY u.n";

/// Attempts after the first (failover). $1 request, $2 seq, $3 provider, $4 upstream
/// model, $5 jurisdiction, $6 started_at, $7 worst case, each an array; $8 replica.
pub const BEGIN_ATTEMPTS: &str = "
INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at,
                      state, billing, worst_case, replica)
SELECT u.request_id, u.seq, u.provider, u.upstream_model, u.jurisdiction, u.started_at,
       'in_flight', 'maybe_billed', u.worst_case, $8::text
FROM unnest($1::text[], $2::integer[], $3::text[], $4::text[], $5::text[], $6::timestamptz[],
            $7::numeric[])
    AS u (request_id, seq, provider, upstream_model, jurisdiction, started_at, worst_case)";

/// Complete attempts. An attempt another replica already recovered (this one lost its
/// lease while the call was out) is completed too: what the vendor answered is better
/// knowledge than the worst case recovery assumed. Answers the (1-based) position of
/// each attempt found. Every column an array, in the order of `AttemptResult`.
pub const FINISH_ATTEMPTS: &str = "
UPDATE attempts a SET finished_at = u.finished_at, state = 'done', status = u.status,
    class = u.class, billing = u.billing, decision = u.decision, reason = u.reason,
    input_tokens = u.input_tokens, output_tokens = u.output_tokens, cost = u.cost,
    cost_basis = u.cost_basis, message = u.message, cache_read_tokens = u.cache_read,
    cache_write_tokens = u.cache_write, cache_write_5m_tokens = u.cache_write_5m,
    cache_write_1h_tokens = u.cache_write_1h, response_id = u.response_id,
    response_items = u.response_items
FROM unnest($1::text[], $2::integer[], $3::timestamptz[], $4::integer[], $5::text[], $6::text[],
            $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::numeric[], $12::text[],
            $13::text[], $14::bigint[], $15::bigint[], $16::bigint[], $17::bigint[], $18::text[],
            $19::bigint[])
    WITH ORDINALITY AS u (request_id, seq, finished_at, status, class, billing, decision, reason,
                          input_tokens, output_tokens, cost, cost_basis, message, cache_read,
                          cache_write, cache_write_5m, cache_write_1h, response_id,
                          response_items, n)
WHERE a.request_id = u.request_id AND a.seq = u.seq
RETURNING u.n";

/// Complete requests and settle what each holds to what it was charged. Each row's old
/// state (held in `reserved`, or moved to `spent` by a recovery) decides which column
/// gives its reservation back; the changes are summed per window first, since an
/// UPDATE applies one joined row per target. Answers the (1-based) position of each
/// request found. $1 id, $2 outcome, $3 error code, $4 served by, $5 cost, $6 charged.
pub const FINISH_REQUESTS: &str = "
WITH u AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::numeric[], $6::numeric[])
        WITH ORDINALITY AS u (id, outcome, error_code, served_by, cost, charged, n)
), o AS (
    SELECT q.id, q.policy, q.received_at, q.outcome AS was, q.reserved_periods AS periods,
           COALESCE(q.reserved_amount, q.worst_case) AS held
    FROM requests q JOIN u ON q.id = u.id FOR UPDATE OF q
), r AS (
    UPDATE requests q SET outcome = u.outcome, error_code = u.error_code, served_by = u.served_by,
        cost = u.cost, reserved_periods = NULL
    FROM o JOIN u ON u.id = o.id WHERE q.id = o.id -- through `o`: its lock and old values first
    RETURNING u.n
), s AS (
    SELECT o.policy, x.period, date_trunc(x.period, o.received_at, 'UTC') AS start,
           sum(CASE WHEN o.was = 'interrupted' THEN 0 ELSE o.held END) AS unreserve,
           sum(CASE WHEN o.was = 'interrupted' THEN o.held ELSE 0 END) AS unspend,
           sum(u.charged) AS charged
    FROM o JOIN u ON u.id = o.id, unnest(o.periods) AS x (period)
    GROUP BY 1, 2, 3
), w AS (
    UPDATE budget_windows b SET reserved = GREATEST(b.reserved - s.unreserve, 0),
        spent = GREATEST(b.spent - s.unspend, 0) + s.charged
    FROM s WHERE b.policy = s.policy AND b.period = s.period AND b.window_start = s.start
)
SELECT n FROM r";

/// Operator settlement, last step: the request's cost becomes `$2` (the exact billed
/// total) and what it holds settles to `$3` (that total plus the worst case of every
/// other attempt still `maybe_billed`). $1 id, $2 total, $3 charged.
pub const SETTLE_REQUEST: &str = "
WITH o AS (
    SELECT id, policy, received_at, outcome, reserved_periods, COALESCE(reserved_amount, worst_case) AS held
    FROM requests WHERE id = $1 FOR UPDATE
), r AS (
    UPDATE requests q SET cost = $2, reserved_periods = NULL
    FROM o WHERE q.id = o.id
    RETURNING o.policy, o.received_at, o.outcome AS was, o.reserved_periods AS periods, o.held
), w AS (
    UPDATE budget_windows b SET
        reserved = CASE WHEN r.was = 'interrupted' THEN b.reserved ELSE GREATEST(b.reserved - r.held, 0) END,
        spent = CASE WHEN r.was = 'interrupted' THEN GREATEST(b.spent - r.held, 0) ELSE b.spent END + $3::numeric
    FROM r
    WHERE b.policy = r.policy AND b.period = ANY (r.periods)
      AND b.window_start = date_trunc(b.period, r.received_at, 'UTC')
)
SELECT count(*) FROM r";

/// Raise an in-flight request's reservation by `$2` in every window it holds, only
/// where the running plan's limit for that period (`$3` periods, `$4` limits; a
/// period absent there is not limited) still allows it; the request's
/// `reserved_amount` grows only when every window took it. Answers whether the request
/// was found in flight, how many windows it holds and which took the top-up (the
/// caller takes a partial one back with `UNRESERVE`).
pub const TOP_UP: &str = "
WITH o AS (
    SELECT id, policy, received_at, reserved_periods FROM requests
    WHERE id = $1 AND outcome = 'in_flight' FOR UPDATE
), p AS (
    SELECT o.policy, x.period, date_trunc(x.period, o.received_at, 'UTC') AS start, l.lim
    FROM o CROSS JOIN unnest(o.reserved_periods) AS x (period)
    LEFT JOIN unnest($3::text[], $4::numeric[]) AS l (period, lim) ON l.period = x.period
), w AS (
    UPDATE budget_windows b SET reserved = b.reserved + $2::numeric,
        limit_amount = COALESCE(p.lim, b.limit_amount)
    FROM p
    WHERE b.policy = p.policy AND b.period = p.period AND b.window_start = p.start
      AND (p.lim IS NULL OR b.spent + b.reserved + $2::numeric <= p.lim)
    RETURNING b.period, b.window_start
), r AS (
    UPDATE requests q SET reserved_amount = COALESCE(q.reserved_amount, q.worst_case) + $2::numeric
    FROM o WHERE q.id = o.id AND (SELECT count(*) FROM w) = (SELECT count(*) FROM p)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM o), (SELECT policy FROM o), (SELECT count(*) FROM p),
       ARRAY(SELECT period FROM w), ARRAY(SELECT window_start FROM w), (SELECT count(*) FROM r)";

/// Whether request `$1` exists, and is in flight.
pub const OUTCOME: &str = "SELECT outcome = 'in_flight' FROM requests WHERE id = $1";

/// The in-flight attempts of the given requests become `interrupted` / `maybe_billed`,
/// charged at their worst case. $1 request ids, $2 reason.
pub const INTERRUPT_ATTEMPTS: &str = "
UPDATE attempts SET state = 'interrupted', billing = 'maybe_billed', decision = 'stop', reason = $2
WHERE request_id = ANY ($1) AND state = 'in_flight'";

/// The given requests, if still in flight, become `interrupted`, and what each holds
/// moves from `reserved` to `spent` (summed per window first: an UPDATE applies one
/// joined row per target). Answers how many requests it interrupted. $1 request ids.
pub const INTERRUPT_REQUESTS: &str = "
WITH o AS (
    SELECT id, policy, received_at, reserved_periods, COALESCE(reserved_amount, worst_case) AS held
    FROM requests WHERE id = ANY ($1) AND outcome = 'in_flight' FOR UPDATE
), r AS (
    UPDATE requests q SET outcome = 'interrupted' FROM o WHERE q.id = o.id RETURNING q.id
), s AS (
    SELECT o.policy, x.period, date_trunc(x.period, o.received_at, 'UTC') AS start, sum(o.held) AS held
    FROM o, unnest(o.reserved_periods) AS x (period)
    GROUP BY 1, 2, 3
), w AS (
    UPDATE budget_windows b SET reserved = GREATEST(b.reserved - s.held, 0), spent = b.spent + s.held
    FROM s WHERE b.policy = s.policy AND b.period = s.period AND b.window_start = s.start
)
SELECT count(*) FROM r";

/// A live process gives up on one request still in flight (`Ledger::interrupt`): its
/// in-flight attempts become `interrupted` / `maybe_billed`, and what it holds is
/// replaced, in `spent`, by what its attempts may have cost (billed costs plus the worst
/// case of each maybe-billed one; the snapshot already counts in-flight attempts as
/// maybe billed). The same rule as SQLite's. $1 id, $2 reason.
pub const INTERRUPT_ONE: &str = "
WITH o AS (
    SELECT id, policy, received_at, reserved_periods, COALESCE(reserved_amount, worst_case) AS held
    FROM requests WHERE id = $1 AND outcome = 'in_flight' FOR UPDATE
), a AS (
    UPDATE attempts SET state = 'interrupted', billing = 'maybe_billed', decision = 'stop', reason = $2
    WHERE request_id = $1 AND state = 'in_flight' AND EXISTS (SELECT 1 FROM o)
), c AS (
    SELECT COALESCE(sum(CASE billing WHEN 'billed' THEN cost WHEN 'maybe_billed' THEN worst_case ELSE 0 END), 0) AS charged,
           COALESCE(sum(CASE billing WHEN 'billed' THEN cost ELSE 0 END), 0) AS cost
    FROM attempts WHERE request_id = $1
), r AS (
    UPDATE requests q SET outcome = 'interrupted', cost = c.cost, reserved_amount = c.charged
    FROM o, c WHERE q.id = o.id
    RETURNING q.id
), w AS (
    UPDATE budget_windows b SET reserved = GREATEST(b.reserved - o.held, 0), spent = b.spent + c.charged
    FROM o, c, unnest(o.reserved_periods) AS x (period)
    WHERE b.policy = o.policy AND b.period = x.period
      AND b.window_start = date_trunc(x.period, o.received_at, 'UTC')
)
SELECT count(*) FROM r";

/// Admissions whose commit this replica could not confirm (the connection failed as
/// the database answered): the gateway was told the ledger is unavailable and made no
/// call, so any of them that did commit is ended `failed` / `ledger_unavailable`, its
/// attempt `not_billed`, and what it holds given back. Requests not found, or no
/// longer in flight, are left alone, so applying it twice changes nothing.
/// $1 request ids, $2 reason, $3 replica. Answers how many it ended.
pub const ABANDON: &str = "
WITH o AS (
    SELECT id, policy, received_at, reserved_periods, COALESCE(reserved_amount, worst_case) AS held
    FROM requests WHERE id = ANY ($1) AND outcome = 'in_flight' AND replica = $3 FOR UPDATE
), a AS (
    UPDATE attempts SET state = 'done', finished_at = now(), billing = 'not_billed', cost = 0,
        decision = 'stop', reason = $2
    WHERE request_id IN (SELECT id FROM o) AND state = 'in_flight'
), r AS (
    UPDATE requests q SET outcome = 'failed', error_code = 'ledger_unavailable', cost = 0,
        reserved_periods = NULL
    FROM o WHERE q.id = o.id RETURNING q.id
), s AS (
    SELECT o.policy, x.period, date_trunc(x.period, o.received_at, 'UTC') AS start, sum(o.held) AS held
    FROM o, unnest(o.reserved_periods) AS x (period)
    GROUP BY 1, 2, 3
), w AS (
    UPDATE budget_windows b SET reserved = GREATEST(b.reserved - s.held, 0)
    FROM s WHERE b.policy = s.policy AND b.period = s.period AND b.window_start = s.start
)
SELECT count(*) FROM r";

/// The readiness probe's write: one small row, this replica's own. $1 replica.
pub const PROBE: &str = "UPDATE replicas SET renewed_at = now() WHERE id = $1";

/// Take this replica's id: only when no live process holds it (its lease expired), or
/// it is ours already. $1 replica, $2 instance, $3 lease in milliseconds.
pub const CLAIM: &str = "
INSERT INTO replicas AS r (id, instance, started_at, renewed_at, expires_at)
VALUES ($1, $2, now(), now(), now() + $3::bigint * interval '1 millisecond')
ON CONFLICT (id) DO UPDATE
    SET instance = excluded.instance, started_at = excluded.started_at,
        renewed_at = excluded.renewed_at, expires_at = excluded.expires_at
    WHERE r.expires_at < now() OR r.instance = excluded.instance
RETURNING 1";

/// Renew the lease. No row: another replica took this id over (this process was
/// stalled past its lease). $1 replica, $2 instance, $3 lease in milliseconds.
pub const RENEW: &str = "
UPDATE replicas SET renewed_at = now(), expires_at = now() + $3::bigint * interval '1 millisecond'
WHERE id = $1 AND instance = $2";

/// Replicas whose lease has expired, other than this one.
pub const EXPIRED: &str = "SELECT id FROM replicas WHERE expires_at < now() AND id <> $1";

/// Claim a dead replica's rows for recovery: the row is deleted in the recovering
/// transaction, so two live replicas never both recover it. $1 replica.
pub const TAKE_OVER: &str = "DELETE FROM replicas WHERE id = $1 AND expires_at < now() RETURNING 1";

pub const IN_FLIGHT_OF: &str =
    "SELECT id FROM requests WHERE replica = $1 AND outcome = 'in_flight'";

/// Attempts a replica left in flight, whatever their request's state.
pub const INTERRUPT_ATTEMPTS_OF: &str = "
UPDATE attempts SET state = 'interrupted', billing = 'maybe_billed', decision = 'stop', reason = $2
WHERE replica = $1 AND state = 'in_flight'";

/// Every write transaction of every replica takes this lock first. Two things follow:
/// the identity `ledger_seq` values are handed out in commit order (an audit page never
/// skips a request committed after it was read), and transactions never deadlock over
/// budget rows, which they would otherwise lock in different orders. Replicas take
/// turns per group of requests, which a shared budget row would impose anyway; one
/// replica never waits on it.
pub const COMMIT_ORDER: &str =
    "SELECT pg_advisory_xact_lock(hashtext('purser.commit_order.' || current_schema()))";

/// `BEGIN` and the commit-order lock in one round trip, with the planner settings of
/// the writer's statements. Each of them reaches its rows by key; a plan made while the
/// tables are small (a replica's first groups, before any ANALYZE) would otherwise
/// scan them whole, and stay cached while they grow: measured, finishing 64 requests
/// took 13 ms against 10,000 rows instead of 3 ms. Their array sizes are all a custom
/// plan would learn, so the generic plan is used from the first group on.
pub const BEGIN_WRITE: &str = "BEGIN;
    SET LOCAL enable_seqscan = off;
    SET LOCAL plan_cache_mode = force_generic_plan;
    SELECT pg_advisory_xact_lock(hashtext('purser.commit_order.' || current_schema()))";

//! The statements the PostgreSQL writer runs. Each budget change is one conditional
//! statement: the row is locked and its condition checked on its newest version by
//! PostgreSQL itself, so replicas sharing a window can never together pass its
//! limit, and nothing is read first and written after.
//!
//! A request's windows are named by period in `requests.reserved_periods`; the start
//! of each is `date_trunc(period, received_at, 'UTC')`, the same instant
//! `window_start_at` computes when the request is admitted.

/// Admission: reserve the worst case in every window (creating a window on first use)
/// only where it fits, record the request as `in_flight` when every window took it (or
/// `refused` / `budget_exhausted` when one did not), and write its first attempt.
/// Answers whether it was admitted and which windows took the reservation: when some
/// did and others did not, the caller takes it back out of those (`UNRESERVE`).
///
/// $1 id, $2 received_at, $3 client, $4 policy, $5 plan_id, $6 model, $7 mode,
/// $8 ceiling, $9 worst_case, $10 periods, $11 window starts, $12 limits, $13 replica,
/// $14 write a first attempt?, $15 seq, $16 provider, $17 upstream_model,
/// $18 jurisdiction, $19 started_at, $20 the attempt's worst case.
pub const ADMIT: &str = "
WITH p AS (
    SELECT * FROM unnest($10::text[], $11::timestamptz[], $12::numeric[]) AS p (period, start, lim)
), b AS (
    INSERT INTO budget_windows AS w (policy, period, window_start, limit_amount, spent, reserved)
    SELECT $4::text, p.period, p.start, p.lim, 0, $9::numeric FROM p WHERE $9::numeric <= p.lim
    ON CONFLICT (policy, period, window_start) DO UPDATE
        SET reserved = w.reserved + excluded.reserved, limit_amount = excluded.limit_amount
        WHERE w.spent + w.reserved + excluded.reserved <= excluded.limit_amount
    RETURNING w.period
), ok AS (
    SELECT (SELECT count(*) FROM b) = (SELECT count(*) FROM p) AS admitted
), r AS (
    INSERT INTO requests (id, received_at, client, policy, plan_id, model, mode, ceiling, worst_case,
                          outcome, error_code, reserved_periods, reserved_amount, replica)
    SELECT $1, $2, $3, $4::text, $5, $6, $7, $8, $9::numeric,
           CASE WHEN ok.admitted THEN 'in_flight' ELSE 'refused' END,
           CASE WHEN ok.admitted THEN NULL ELSE 'budget_exhausted' END,
           CASE WHEN ok.admitted AND cardinality($10::text[]) > 0 THEN $10::text[] END,
           CASE WHEN ok.admitted AND cardinality($10::text[]) > 0 THEN $9::numeric END,
           $13::text
    FROM ok
    RETURNING id
), a AS (
    INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at,
                          state, billing, worst_case, replica)
    SELECT r.id, $15, $16, $17, $18, $19, 'in_flight', 'maybe_billed', $20, $13::text
    FROM ok, r WHERE ok.admitted AND $14::boolean
)
SELECT ok.admitted, ARRAY(SELECT period FROM b) FROM ok";

/// Take `amount` back out of the named windows' `reserved` (a partial reservation, in
/// the same transaction that made it, so no one else has seen it).
/// $1 policy, $2 periods, $3 starts, $4 amount.
pub const UNRESERVE: &str = "
UPDATE budget_windows w SET reserved = w.reserved - $4::numeric
FROM unnest($2::text[], $3::timestamptz[]) AS p (period, start)
WHERE w.policy = $1 AND w.period = p.period AND w.window_start = p.start";

/// The named windows as they stand, to say which one refused and by how much.
/// $1 policy, $2 periods, $3 starts.
pub const WINDOWS: &str = "
SELECT w.period, w.limit_amount, w.spent, w.reserved
FROM budget_windows w JOIN unnest($2::text[], $3::timestamptz[]) AS p (period, start)
  ON w.policy = $1 AND w.period = p.period AND w.window_start = p.start";

/// A request refused before any attempt. $1..$9 as in ADMIT, $10 error code, $11 replica.
pub const REFUSAL: &str = "
INSERT INTO requests (id, received_at, client, policy, plan_id, model, mode, ceiling, worst_case,
                      outcome, error_code, replica)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'refused', $10, $11)";

/// $1 request, $2 seq, $3 provider, $4 upstream model, $5 jurisdiction, $6 started_at,
/// $7 worst case, $8 replica.
pub const BEGIN_ATTEMPT: &str = "
INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at,
                      state, billing, worst_case, replica)
VALUES ($1, $2, $3, $4, $5, $6, 'in_flight', 'maybe_billed', $7, $8)";

/// Complete an attempt. An attempt another replica already recovered (this one lost
/// its lease while the call was out) is completed too: what the vendor answered is
/// better knowledge than the worst case recovery assumed.
pub const FINISH_ATTEMPT: &str = "
UPDATE attempts SET finished_at = $3, state = 'done', status = $4, class = $5, billing = $6,
    decision = $7, reason = $8, input_tokens = $9, output_tokens = $10, cost = $11,
    cost_basis = $12, message = $13
WHERE request_id = $1 AND seq = $2";

/// Complete a request and settle what it holds to what it was charged, in one
/// statement: the row's old state (held in `reserved`, or moved to `spent` by a
/// recovery) decides which column gives the reservation back.
/// $1 id, $2 outcome, $3 error code, $4 served by, $5 cost, $6 charged.
pub const FINISH_REQUEST: &str = "
WITH o AS (
    SELECT id, policy, received_at, outcome, reserved_periods, COALESCE(reserved_amount, worst_case) AS held
    FROM requests WHERE id = $1 FOR UPDATE
), r AS (
    UPDATE requests q SET outcome = $2, error_code = $3, served_by = $4, cost = $5, reserved_periods = NULL
    FROM o WHERE q.id = o.id
    RETURNING o.policy, o.received_at, o.outcome AS was, o.reserved_periods AS periods, o.held
), w AS (
    UPDATE budget_windows b SET
        reserved = CASE WHEN r.was = 'interrupted' THEN b.reserved ELSE GREATEST(b.reserved - r.held, 0) END,
        spent = CASE WHEN r.was = 'interrupted' THEN GREATEST(b.spent - r.held, 0) ELSE b.spent END + $6::numeric
    FROM r
    WHERE b.policy = r.policy AND b.period = ANY (r.periods)
      AND b.window_start = date_trunc(b.period, r.received_at, 'UTC')
)
SELECT count(*) FROM r";

/// Operator settlement, last step: the request's cost becomes `$2` (the exact billed
/// total) and what it holds settles to it. $1 id, $2 total.
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
        spent = CASE WHEN r.was = 'interrupted' THEN GREATEST(b.spent - r.held, 0) ELSE b.spent END + $2::numeric
    FROM r
    WHERE b.policy = r.policy AND b.period = ANY (r.periods)
      AND b.window_start = date_trunc(b.period, r.received_at, 'UTC')
)
SELECT count(*) FROM r";

/// Raise an in-flight request's reservation by `$2` in every window it holds, only
/// where the stored limit still allows it; the request's `reserved_amount` grows only
/// when every window took it. Answers whether the request was found in flight, how
/// many windows it holds and which took the top-up (the caller takes a partial one
/// back with `UNRESERVE`).
pub const TOP_UP: &str = "
WITH o AS (
    SELECT id, policy, received_at, reserved_periods FROM requests
    WHERE id = $1 AND outcome = 'in_flight' FOR UPDATE
), p AS (
    SELECT o.policy, x.period, date_trunc(x.period, o.received_at, 'UTC') AS start
    FROM o, unnest(o.reserved_periods) AS x (period)
), w AS (
    UPDATE budget_windows b SET reserved = b.reserved + $2::numeric
    FROM p
    WHERE b.policy = p.policy AND b.period = p.period AND b.window_start = p.start
      AND b.spent + b.reserved + $2::numeric <= b.limit_amount
    RETURNING b.period, b.window_start
), r AS (
    UPDATE requests q SET reserved_amount = COALESCE(q.reserved_amount, q.worst_case) + $2::numeric
    FROM o WHERE q.id = o.id AND (SELECT count(*) FROM w) = (SELECT count(*) FROM p)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM o), (SELECT policy FROM o), (SELECT count(*) FROM p),
       ARRAY(SELECT period FROM w), ARRAY(SELECT window_start FROM w), (SELECT count(*) FROM r)";

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

/// `BEGIN` and the commit-order lock in one round trip.
pub const BEGIN_WRITE: &str =
    "BEGIN; SELECT pg_advisory_xact_lock(hashtext('purser.commit_order.' || current_schema()))";

-- purser ledger on PostgreSQL, version 2: a budget window starts from the ledger.
--
-- A window seen for the first time (a budget added mid-period, or a new period) is
-- created holding in `spent` what the ledger already charges its policy in that
-- period, in the transaction that creates it: before, it started at zero, and a team
-- that had spent more than a new budget was admitted under it.

-- What the ledger charges `p_policy` in the `p_period` window starting at `p_start`:
-- for each request received in it, its attempts' billed costs plus the worst case of
-- each attempt that may have been billed (in-flight attempts count so), and for a
-- request still in flight at least what it holds (a failover top-up may have raised
-- it). Those requests hold nothing in the new window, so what they are charged later
-- is never counted twice. Read through `attempts_by_start`: every attempt of a request
-- received in the window starts at or after its start.
CREATE FUNCTION purser_charged(p_policy text, p_period text, p_start timestamptz)
RETURNS numeric LANGUAGE sql STABLE AS $$
    SELECT COALESCE(sum(c), 0) FROM (
        SELECT CASE WHEN q.outcome = 'in_flight'
                    THEN GREATEST(sum(x.charge), max(COALESCE(q.reserved_amount, q.worst_case)))
                    ELSE sum(x.charge) END AS c
        FROM attempts a
        JOIN requests q ON q.id = a.request_id
        CROSS JOIN LATERAL (SELECT CASE a.billing WHEN 'billed' THEN a.cost
                                                  WHEN 'maybe_billed' THEN a.worst_case
                                                  ELSE 0 END AS charge) x
        WHERE a.started_at >= p_start
          AND q.policy = p_policy
          AND q.received_at >= p_start
          AND q.received_at < p_start + ('1 ' || p_period)::interval
          -- A request in flight holding this window (one re-seeded by a reload) is in
          -- `reserved`, and its settlement moves its charge to `spent`.
          AND NOT (q.outcome = 'in_flight' AND p_period = ANY (COALESCE(q.reserved_periods, '{}')))
        GROUP BY q.id, q.outcome
    ) s
$$;

-- As in version 1, with the window created from the ledger when it does not exist
-- (whether or not this amount then fits: a refusal reports the seeded figures). Every
-- writer holds the commit-order lock, so no other transaction creates it meanwhile;
-- `ON CONFLICT DO NOTHING` only keeps a stray concurrent writer from failing this one.
CREATE OR REPLACE FUNCTION purser_reserve(
    p_policy text, p_period text, p_start timestamptz, p_limit numeric, p_amount numeric
) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE budget_windows w SET reserved = w.reserved + p_amount, limit_amount = p_limit
    WHERE w.policy = p_policy AND w.period = p_period AND w.window_start = p_start
      AND w.spent + w.reserved + p_amount <= p_limit;
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM budget_windows w
                   WHERE w.policy = p_policy AND w.period = p_period AND w.window_start = p_start) THEN
        INSERT INTO budget_windows (policy, period, window_start, limit_amount, spent, reserved)
        VALUES (p_policy, p_period, p_start, p_limit,
                purser_charged(p_policy, p_period, p_start), 0)
        ON CONFLICT (policy, period, window_start) DO NOTHING;
        UPDATE budget_windows w SET reserved = w.reserved + p_amount, limit_amount = p_limit
        WHERE w.policy = p_policy AND w.period = p_period AND w.window_start = p_start
          AND w.spent + w.reserved + p_amount <= p_limit;
        RETURN FOUND;
    END IF;
    RETURN false;
END
$$;

-- purser ledger on PostgreSQL, version 7: a window created (or counted again) while
-- requests of its period are open makes them its holders.
--
-- Before, such a request was counted once, as `spent`, at what it held then, and held
-- nothing in the window: when it settled above that (a soft request whose vendor
-- reported more usage than the bound allowed), or below, or an operator settled it
-- after an interruption, the window never heard of it. Now it is given the window as
-- if it had been admitted under the budget: the period joins its `reserved_periods`,
-- what it holds joins the window's `reserved` (in flight) or `spent` (interrupted, as
-- recovery left it), and settlement, top-up, interrupt and lease-expiry recovery treat
-- it as they treat every holder. The same rule as SQLite's (`Books::seed`).

-- The open requests received in the window that do not hold it: in flight, or
-- interrupted and not settled (still holding elsewhere, or with an attempt an operator
-- may yet settle). `amount`: what each will hold; one amount per request across its
-- windows, so a request that holds nothing yet holds what it was charged once
-- interrupted (as `INTERRUPT_ONE` leaves it). Read through `attempts_by_start`.
CREATE FUNCTION purser_adoptable(p_policy text, p_period text, p_start timestamptz)
RETURNS TABLE (id text, in_flight boolean, periods text[], amount numeric)
LANGUAGE plpgsql STABLE AS $f$
BEGIN
    -- Through EXECUTE, planned with the window's actual bounds (as 0005 does for
    -- `purser_charged`): a SQL function's parameters are no constants to the planner,
    -- which then joins every attempt of a big ledger.
    RETURN QUERY EXECUTE $q$
    SELECT q.id, q.outcome = 'in_flight',
           array_append(COALESCE(q.reserved_periods, '{}'), $2),
           CASE WHEN q.reserved_periods IS NULL AND q.outcome = 'interrupted'
                THEN sum(CASE a.billing WHEN 'billed' THEN a.cost
                                        WHEN 'maybe_billed' THEN a.worst_case ELSE 0 END)
                ELSE COALESCE(q.reserved_amount, q.worst_case) END
    FROM attempts a
    JOIN requests q ON q.id = a.request_id
    WHERE a.started_at >= $3
      AND q.policy = $1
      AND q.received_at >= $3
      AND q.received_at < $3 + ('1 ' || $2)::interval
      AND q.outcome IN ('in_flight', 'interrupted')
      AND NOT ($2 = ANY (COALESCE(q.reserved_periods, '{}')))
    GROUP BY q.ledger_seq
    HAVING q.outcome = 'in_flight' OR q.reserved_periods IS NOT NULL
        OR bool_or(a.state = 'interrupted' AND a.billing = 'maybe_billed')
    $q$ USING p_policy, p_period, p_start;
END
$f$;

-- Make them holders; answers what those in flight hold (for the window's `reserved`).
CREATE FUNCTION purser_adopt(p_policy text, p_period text, p_start timestamptz)
RETURNS numeric LANGUAGE sql AS $$
    WITH o AS (
        SELECT * FROM purser_adoptable(p_policy, p_period, p_start)
    ), u AS (
        UPDATE requests q SET reserved_periods = o.periods, reserved_amount = o.amount
        FROM o WHERE q.id = o.id
        RETURNING o.in_flight, o.amount
    )
    SELECT COALESCE(sum(amount) FILTER (WHERE in_flight), 0) FROM u
$$;

-- What the window's `spent` is, counted from the ledger, its open requests being (or
-- about to be made) its holders: a request in flight is in `reserved`, not here; one
-- interrupted that holds (or will hold) is here at what it holds; every other at its
-- attempts' billed costs plus the worst case of each that may have been billed. The
-- same figure before and after `purser_adopt`.
CREATE OR REPLACE FUNCTION purser_charged(p_policy text, p_period text, p_start timestamptz)
RETURNS numeric LANGUAGE plpgsql STABLE AS $f$
DECLARE
    total numeric;
BEGIN
    -- Through EXECUTE, as version 5 made it: planned with the window's bounds.
    EXECUTE $q$
    SELECT COALESCE(sum(c), 0) FROM (
        SELECT CASE
                 WHEN q.outcome = 'in_flight' THEN 0
                 WHEN q.outcome = 'interrupted' AND q.reserved_periods IS NOT NULL
                   THEN COALESCE(q.reserved_amount, q.worst_case)
                 ELSE sum(CASE a.billing WHEN 'billed' THEN a.cost
                                         WHEN 'maybe_billed' THEN a.worst_case ELSE 0 END)
               END AS c
        FROM attempts a
        JOIN requests q ON q.id = a.request_id
        WHERE a.started_at >= $3
          AND q.policy = $1
          AND q.received_at >= $3
          AND q.received_at < $3 + ('1 ' || $2)::interval
        GROUP BY q.ledger_seq
    ) s
    $q$ INTO total USING p_policy, p_period, p_start;
    RETURN total;
END
$f$;

-- Create the window from the ledger if it does not exist (with `p_limit`), else count
-- it again (`Op::ReseedWindows`: its old holders are in `reserved` already, the
-- adopted ones are added). Every writer holds the commit-order lock.
CREATE FUNCTION purser_seed(p_policy text, p_period text, p_start timestamptz, p_limit numeric)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    adopted numeric;
BEGIN
    IF p_limit IS NULL AND NOT EXISTS (
        SELECT 1 FROM budget_windows w
        WHERE w.policy = p_policy AND w.period = p_period AND w.window_start = p_start) THEN
        RETURN; -- nothing to count again; created, and seeded, when first needed
    END IF;
    adopted := purser_adopt(p_policy, p_period, p_start);
    INSERT INTO budget_windows AS w (policy, period, window_start, limit_amount, spent, reserved)
    VALUES (p_policy, p_period, p_start, COALESCE(p_limit, 0),
            purser_charged(p_policy, p_period, p_start), adopted)
    ON CONFLICT (policy, period, window_start) DO UPDATE
        SET spent = excluded.spent, reserved = w.reserved + excluded.reserved;
END
$$;

-- As in version 2, with the window created by `purser_seed`.
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
        PERFORM purser_seed(p_policy, p_period, p_start, p_limit);
        UPDATE budget_windows w SET reserved = w.reserved + p_amount, limit_amount = p_limit
        WHERE w.policy = p_policy AND w.period = p_period AND w.window_start = p_start
          AND w.spent + w.reserved + p_amount <= p_limit;
        RETURN FOUND;
    END IF;
    RETURN false;
END
$$;

-- Hourly rollups of attempts and requests, so the spend page totals a month from a
-- few hundred thousand rows instead of ten million (#25). Kept by statement-level
-- triggers over the statement's transition tables, in the transaction of the change
-- they summarise: every way a row's cost, billing, class or outcome changes (the
-- writer's batches, settlement, interrupt, lease recovery, an operator's SQL) keeps
-- them equal to the raw rows, and a batch of 500 attempts costs one upsert per key,
-- not 500. Every writer takes the commit-order lock first (`sql::COMMIT_ORDER`), so
-- two transactions never update rollup rows in opposite orders.

CREATE TABLE attempts_hourly (
    hour       timestamptz NOT NULL,  -- the UTC hour the attempt started
    provider   text NOT NULL,
    policy     text NOT NULL,
    client     text NOT NULL,
    model      text NOT NULL,
    ingress    text NOT NULL,
    class      text NOT NULL,         -- '' while the attempt is in flight (class NULL)
    later      boolean NOT NULL,      -- seq > 1 (served after a failover)
    billing    text NOT NULL,
    attempts   bigint NOT NULL,
    cost       numeric NOT NULL,      -- exact sum of cost
    worst_case numeric NOT NULL,      -- exact sum of worst_case
    PRIMARY KEY (hour, provider, policy, client, model, ingress, class, later, billing)
);

-- The same without the client: the page's usual questions (by provider, policy,
-- model) read a fifth of the rows when a policy has several clients.
CREATE TABLE attempts_hourly_lean (
    hour       timestamptz NOT NULL,
    provider   text NOT NULL,
    policy     text NOT NULL,
    model      text NOT NULL,
    ingress    text NOT NULL,
    class      text NOT NULL,
    later      boolean NOT NULL,
    billing    text NOT NULL,
    attempts   bigint NOT NULL,
    cost       numeric NOT NULL,
    worst_case numeric NOT NULL,
    PRIMARY KEY (hour, provider, policy, model, ingress, class, later, billing)
);

CREATE TABLE requests_hourly (
    hour     timestamptz NOT NULL,    -- the UTC hour the request was received
    policy   text NOT NULL,
    client   text NOT NULL,
    model    text NOT NULL,
    ingress  text NOT NULL,
    outcome  text NOT NULL,
    requests bigint NOT NULL,
    PRIMARY KEY (hour, policy, client, model, ingress, outcome)
);

INSERT INTO attempts_hourly (hour, provider, policy, client, model, ingress, class, later, billing, attempts, cost, worst_case)
SELECT date_trunc('hour', a.started_at, 'UTC'), a.provider, r.policy, r.client, r.model, r.ingress,
       COALESCE(a.class, ''), a.seq > 1, a.billing, count(*), sum(a.cost), sum(a.worst_case)
FROM attempts a JOIN requests r ON r.id = a.request_id
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9;

INSERT INTO attempts_hourly_lean (hour, provider, policy, model, ingress, class, later, billing, attempts, cost, worst_case)
SELECT hour, provider, policy, model, ingress, class, later, billing, sum(attempts), sum(cost), sum(worst_case)
FROM attempts_hourly
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;

INSERT INTO requests_hourly (hour, policy, client, model, ingress, outcome, requests)
SELECT date_trunc('hour', received_at, 'UTC'), policy, client, model, ingress, outcome, count(*)
FROM requests
GROUP BY 1, 2, 3, 4, 5, 6;

-- Add the signed rows of one statement: +1 per new row, -1 per old row, netted per
-- key, so a statement that changes nothing the rollup keeps (a reason, tokens) writes
-- nothing. Keys left with no attempt are removed. The rows come as arrays so that
-- this function's statements are planned once per session (plpgsql caches them).
CREATE FUNCTION purser_attempts_hourly_add(
    d_request text[], d_seq integer[], d_provider text[], d_started timestamptz[],
    d_class text[], d_billing text[], d_cost numeric[], d_worst numeric[], d_sign integer[]
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempts_hourly AS h (hour, provider, policy, client, model, ingress, class, later, billing, attempts, cost, worst_case)
    SELECT date_trunc('hour', d.started, 'UTC'), d.provider, r.policy, r.client, r.model, r.ingress,
           COALESCE(d.class, ''), d.seq > 1, d.billing, sum(d.sign), sum(d.sign * d.cost), sum(d.sign * d.worst)
    FROM unnest(d_request, d_seq, d_provider, d_started, d_class, d_billing, d_cost, d_worst, d_sign)
         AS d (request_id, seq, provider, started, class, billing, cost, worst, sign)
    JOIN requests r ON r.id = d.request_id
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
    HAVING sum(d.sign) <> 0 OR sum(d.sign * d.cost) <> 0 OR sum(d.sign * d.worst) <> 0
    ON CONFLICT (hour, provider, policy, client, model, ingress, class, later, billing) DO UPDATE
    SET attempts = h.attempts + excluded.attempts, cost = h.cost + excluded.cost,
        worst_case = h.worst_case + excluded.worst_case;
    INSERT INTO attempts_hourly_lean AS h (hour, provider, policy, model, ingress, class, later, billing, attempts, cost, worst_case)
    SELECT date_trunc('hour', d.started, 'UTC'), d.provider, r.policy, r.model, r.ingress,
           COALESCE(d.class, ''), d.seq > 1, d.billing, sum(d.sign), sum(d.sign * d.cost), sum(d.sign * d.worst)
    FROM unnest(d_request, d_seq, d_provider, d_started, d_class, d_billing, d_cost, d_worst, d_sign)
         AS d (request_id, seq, provider, started, class, billing, cost, worst, sign)
    JOIN requests r ON r.id = d.request_id
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
    HAVING sum(d.sign) <> 0 OR sum(d.sign * d.cost) <> 0 OR sum(d.sign * d.worst) <> 0
    ON CONFLICT (hour, provider, policy, model, ingress, class, later, billing) DO UPDATE
    SET attempts = h.attempts + excluded.attempts, cost = h.cost + excluded.cost,
        worst_case = h.worst_case + excluded.worst_case;
    IF -1 = ANY (d_sign) THEN
        DELETE FROM attempts_hourly_lean h WHERE h.attempts = 0
          AND (h.hour, h.provider, h.policy, h.model, h.ingress, h.class, h.later, h.billing) IN (
              SELECT date_trunc('hour', d.started, 'UTC'), d.provider, r.policy, r.model, r.ingress,
                     COALESCE(d.class, ''), d.seq > 1, d.billing
              FROM unnest(d_request, d_seq, d_provider, d_started, d_class, d_billing, d_sign)
                   AS d (request_id, seq, provider, started, class, billing, sign)
              JOIN requests r ON r.id = d.request_id
              WHERE d.sign < 0);
        DELETE FROM attempts_hourly h WHERE h.attempts = 0
          AND (h.hour, h.provider, h.policy, h.client, h.model, h.ingress, h.class, h.later, h.billing) IN (
              SELECT date_trunc('hour', d.started, 'UTC'), d.provider, r.policy, r.client, r.model, r.ingress,
                     COALESCE(d.class, ''), d.seq > 1, d.billing
              FROM unnest(d_request, d_seq, d_provider, d_started, d_class, d_billing, d_sign)
                   AS d (request_id, seq, provider, started, class, billing, sign)
              JOIN requests r ON r.id = d.request_id
              WHERE d.sign < 0);
    END IF;
END
$$;

CREATE FUNCTION purser_attempts_hourly() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Each branch names only the transition tables its event has (plpgsql plans a
    -- statement when it first runs it).
    IF TG_OP = 'INSERT' THEN
        PERFORM purser_attempts_hourly_add(array_agg(n.request_id), array_agg(n.seq), array_agg(n.provider),
            array_agg(n.started_at), array_agg(n.class), array_agg(n.billing), array_agg(n.cost),
            array_agg(n.worst_case), array_agg(1))
        FROM new_rows n HAVING count(*) > 0;
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM purser_attempts_hourly_add(array_agg(d.request_id), array_agg(d.seq), array_agg(d.provider),
            array_agg(d.started_at), array_agg(d.class), array_agg(d.billing), array_agg(d.cost),
            array_agg(d.worst_case), array_agg(d.sign))
        FROM (SELECT n.request_id, n.seq, n.provider, n.started_at, n.class, n.billing, n.cost, n.worst_case, 1 AS sign
              FROM new_rows n
              UNION ALL
              SELECT o.request_id, o.seq, o.provider, o.started_at, o.class, o.billing, o.cost, o.worst_case, -1
              FROM old_rows o) d
        HAVING count(*) > 0;
    ELSE
        PERFORM purser_attempts_hourly_add(array_agg(o.request_id), array_agg(o.seq), array_agg(o.provider),
            array_agg(o.started_at), array_agg(o.class), array_agg(o.billing), array_agg(o.cost),
            array_agg(o.worst_case), array_agg(-1))
        FROM old_rows o HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION purser_requests_hourly_add(
    d_received timestamptz[], d_policy text[], d_client text[], d_model text[], d_ingress text[],
    d_outcome text[], d_sign integer[]
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO requests_hourly AS h (hour, policy, client, model, ingress, outcome, requests)
    SELECT date_trunc('hour', d.received, 'UTC'), d.policy, d.client, d.model, d.ingress, d.outcome, sum(d.sign)
    FROM unnest(d_received, d_policy, d_client, d_model, d_ingress, d_outcome, d_sign)
         AS d (received, policy, client, model, ingress, outcome, sign)
    GROUP BY 1, 2, 3, 4, 5, 6
    HAVING sum(d.sign) <> 0
    ON CONFLICT (hour, policy, client, model, ingress, outcome) DO UPDATE
    SET requests = h.requests + excluded.requests;
    IF -1 = ANY (d_sign) THEN
        DELETE FROM requests_hourly h WHERE h.requests = 0
          AND (h.hour, h.policy, h.client, h.model, h.ingress, h.outcome) IN (
              SELECT date_trunc('hour', d.received, 'UTC'), d.policy, d.client, d.model, d.ingress, d.outcome
              FROM unnest(d_received, d_policy, d_client, d_model, d_ingress, d_outcome, d_sign)
                   AS d (received, policy, client, model, ingress, outcome, sign)
              WHERE d.sign < 0);
    END IF;
END
$$;

CREATE FUNCTION purser_requests_hourly() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM purser_requests_hourly_add(array_agg(n.received_at), array_agg(n.policy), array_agg(n.client),
            array_agg(n.model), array_agg(n.ingress), array_agg(n.outcome), array_agg(1))
        FROM new_rows n HAVING count(*) > 0;
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM purser_requests_hourly_add(array_agg(d.received_at), array_agg(d.policy), array_agg(d.client),
            array_agg(d.model), array_agg(d.ingress), array_agg(d.outcome), array_agg(d.sign))
        FROM (SELECT n.received_at, n.policy, n.client, n.model, n.ingress, n.outcome, 1 AS sign FROM new_rows n
              UNION ALL
              SELECT o.received_at, o.policy, o.client, o.model, o.ingress, o.outcome, -1 FROM old_rows o) d
        HAVING count(*) > 0;
    ELSE
        PERFORM purser_requests_hourly_add(array_agg(o.received_at), array_agg(o.policy), array_agg(o.client),
            array_agg(o.model), array_agg(o.ingress), array_agg(o.outcome), array_agg(-1))
        FROM old_rows o HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER attempts_hourly_insert AFTER INSERT ON attempts
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION purser_attempts_hourly();
CREATE TRIGGER attempts_hourly_update AFTER UPDATE ON attempts
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION purser_attempts_hourly();
CREATE TRIGGER attempts_hourly_delete AFTER DELETE ON attempts
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION purser_attempts_hourly();
CREATE TRIGGER requests_hourly_insert AFTER INSERT ON requests
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION purser_requests_hourly();
CREATE TRIGGER requests_hourly_update AFTER UPDATE ON requests
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION purser_requests_hourly();
CREATE TRIGGER requests_hourly_delete AFTER DELETE ON requests
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION purser_requests_hourly();

-- The spend page's budgets panel seeds a window not created yet from `purser_charged`.
-- As a SQL function its query was planned without the window's bounds (a function's
-- parameters are not constants to the planner), so on ten million attempts it chose
-- to join them all: 3 s per call. Run through EXECUTE, it is planned with the actual
-- bounds and reads the window's attempts by `attempts_by_start`: 2-6 ms. Same body,
-- same answer; the writer's `purser_reserve` gains the same when it seeds a window.
CREATE OR REPLACE FUNCTION purser_charged(p_policy text, p_period text, p_start timestamptz)
RETURNS numeric LANGUAGE plpgsql STABLE AS $f$
DECLARE
    total numeric;
BEGIN
    EXECUTE $q$
        SELECT COALESCE(sum(c), 0) FROM (
            SELECT CASE WHEN q.outcome = 'in_flight'
                        THEN GREATEST(sum(x.charge), max(COALESCE(q.reserved_amount, q.worst_case)))
                        ELSE sum(x.charge) END AS c
            FROM attempts a
            JOIN requests q ON q.id = a.request_id
            CROSS JOIN LATERAL (SELECT CASE a.billing WHEN 'billed' THEN a.cost
                                                      WHEN 'maybe_billed' THEN a.worst_case
                                                      ELSE 0 END AS charge) x
            WHERE a.started_at >= $3
              AND q.policy = $1
              AND q.received_at >= $3
              AND q.received_at < $3 + ('1 ' || $2)::interval
              AND NOT (q.outcome = 'in_flight' AND $2 = ANY (COALESCE(q.reserved_periods, '{}')))
            GROUP BY q.id, q.outcome
        ) s $q$
    INTO total USING p_policy, p_period, p_start;
    RETURN total;
END
$f$;

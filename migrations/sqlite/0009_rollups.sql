-- Hourly rollups of attempts and requests, so the spend page totals a month from a
-- few hundred thousand rows instead of ten million (#25). Kept by triggers, in the
-- transaction of the row change they summarise: every way a row's cost, billing,
-- class or outcome changes (finish, settle, interrupt, recovery, an operator's SQL)
-- keeps them equal to the raw rows, and no writer path can forget to. Amounts are
-- exact decimal TEXT, added by purser's `dadd`/`dsub` functions (registered on every
-- connection purser opens; a connection without them cannot change these rows).

-- One row per (UTC hour the attempt started, provider, its request's policy, client,
-- model and ingress, class, whether it came after the first attempt, billing).
CREATE TABLE attempts_hourly (
    hour       TEXT NOT NULL,     -- 'YYYY-MM-DDTHH': the first 13 characters of started_at
    provider   TEXT NOT NULL,
    policy     TEXT NOT NULL,
    client     TEXT NOT NULL,
    model      TEXT NOT NULL,
    ingress    TEXT NOT NULL,
    class      TEXT NOT NULL,     -- '' while the attempt is in flight (class NULL)
    later      INTEGER NOT NULL,  -- 1 when seq > 1 (served after a failover)
    billing    TEXT NOT NULL,
    attempts   INTEGER NOT NULL,
    cost       TEXT NOT NULL,     -- exact sum of cost
    worst_case TEXT NOT NULL,     -- exact sum of worst_case (counted as exposure when maybe_billed)
    PRIMARY KEY (hour, provider, policy, client, model, ingress, class, later, billing)
) WITHOUT ROWID;

-- The same without the client: the page's usual questions (by provider, policy,
-- model) read a fifth of the rows when a policy has several clients.
CREATE TABLE attempts_hourly_lean (
    hour       TEXT NOT NULL,
    provider   TEXT NOT NULL,
    policy     TEXT NOT NULL,
    model      TEXT NOT NULL,
    ingress    TEXT NOT NULL,
    class      TEXT NOT NULL,
    later      INTEGER NOT NULL,
    billing    TEXT NOT NULL,
    attempts   INTEGER NOT NULL,
    cost       TEXT NOT NULL,
    worst_case TEXT NOT NULL,
    PRIMARY KEY (hour, provider, policy, model, ingress, class, later, billing)
) WITHOUT ROWID;

-- One row per (UTC hour the request was received, policy, client, model, ingress, outcome).
CREATE TABLE requests_hourly (
    hour     TEXT NOT NULL,       -- 'YYYY-MM-DDTHH': the first 13 characters of received_at
    policy   TEXT NOT NULL,
    client   TEXT NOT NULL,
    model    TEXT NOT NULL,
    ingress  TEXT NOT NULL,
    outcome  TEXT NOT NULL,
    requests INTEGER NOT NULL,
    PRIMARY KEY (hour, policy, client, model, ingress, outcome)
) WITHOUT ROWID;

INSERT INTO attempts_hourly (hour, provider, policy, client, model, ingress, class, later, billing, attempts, cost, worst_case)
SELECT substr(a.started_at, 1, 13), a.provider, r.policy, r.client, r.model, r.ingress,
       COALESCE(a.class, ''), a.seq > 1, a.billing, count(*), dsum(a.cost), dsum(a.worst_case)
FROM attempts a JOIN requests r ON r.id = a.request_id
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9;

INSERT INTO attempts_hourly_lean (hour, provider, policy, model, ingress, class, later, billing, attempts, cost, worst_case)
SELECT hour, provider, policy, model, ingress, class, later, billing, sum(attempts), dsum(cost), dsum(worst_case)
FROM attempts_hourly
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;

INSERT INTO requests_hourly (hour, policy, client, model, ingress, outcome, requests)
SELECT substr(received_at, 1, 13), policy, client, model, ingress, outcome, count(*)
FROM requests
GROUP BY 1, 2, 3, 4, 5, 6;

CREATE TRIGGER attempts_hourly_insert AFTER INSERT ON attempts BEGIN
    INSERT INTO attempts_hourly (hour, provider, policy, client, model, ingress, class, later, billing, attempts, cost, worst_case)
    SELECT substr(NEW.started_at, 1, 13), NEW.provider, r.policy, r.client, r.model, r.ingress,
           COALESCE(NEW.class, ''), NEW.seq > 1, NEW.billing, 1, NEW.cost, NEW.worst_case
    FROM requests r WHERE r.id = NEW.request_id
    ON CONFLICT (hour, provider, policy, client, model, ingress, class, later, billing) DO UPDATE
    SET attempts = attempts + 1, cost = dadd(cost, excluded.cost), worst_case = dadd(worst_case, excluded.worst_case);
    INSERT INTO attempts_hourly_lean (hour, provider, policy, model, ingress, class, later, billing, attempts, cost, worst_case)
    SELECT substr(NEW.started_at, 1, 13), NEW.provider, r.policy, r.model, r.ingress,
           COALESCE(NEW.class, ''), NEW.seq > 1, NEW.billing, 1, NEW.cost, NEW.worst_case
    FROM requests r WHERE r.id = NEW.request_id
    ON CONFLICT (hour, provider, policy, model, ingress, class, later, billing) DO UPDATE
    SET attempts = attempts + 1, cost = dadd(cost, excluded.cost), worst_case = dadd(worst_case, excluded.worst_case);
END;

-- Only a change to what the rollup keys or sums moves the row (a reason, a message or
-- tokens do not).
CREATE TRIGGER attempts_hourly_update AFTER UPDATE ON attempts
WHEN OLD.class IS NOT NEW.class OR OLD.billing IS NOT NEW.billing OR OLD.cost IS NOT NEW.cost
  OR OLD.worst_case IS NOT NEW.worst_case OR OLD.started_at IS NOT NEW.started_at
  OR OLD.provider IS NOT NEW.provider OR OLD.seq IS NOT NEW.seq OR OLD.request_id IS NOT NEW.request_id
BEGIN
    UPDATE attempts_hourly
    SET attempts = attempts - 1, cost = dsub(cost, OLD.cost), worst_case = dsub(worst_case, OLD.worst_case)
    WHERE (hour, provider, policy, client, model, ingress, class, later, billing) =
          (SELECT substr(OLD.started_at, 1, 13), OLD.provider, r.policy, r.client, r.model, r.ingress,
                  COALESCE(OLD.class, ''), OLD.seq > 1, OLD.billing
           FROM requests r WHERE r.id = OLD.request_id);
    DELETE FROM attempts_hourly
    WHERE attempts = 0 AND (hour, provider, policy, client, model, ingress, class, later, billing) =
          (SELECT substr(OLD.started_at, 1, 13), OLD.provider, r.policy, r.client, r.model, r.ingress,
                  COALESCE(OLD.class, ''), OLD.seq > 1, OLD.billing
           FROM requests r WHERE r.id = OLD.request_id);
    UPDATE attempts_hourly_lean
    SET attempts = attempts - 1, cost = dsub(cost, OLD.cost), worst_case = dsub(worst_case, OLD.worst_case)
    WHERE (hour, provider, policy, model, ingress, class, later, billing) =
          (SELECT substr(OLD.started_at, 1, 13), OLD.provider, r.policy, r.model, r.ingress,
                  COALESCE(OLD.class, ''), OLD.seq > 1, OLD.billing
           FROM requests r WHERE r.id = OLD.request_id);
    DELETE FROM attempts_hourly_lean
    WHERE attempts = 0 AND (hour, provider, policy, model, ingress, class, later, billing) =
          (SELECT substr(OLD.started_at, 1, 13), OLD.provider, r.policy, r.model, r.ingress,
                  COALESCE(OLD.class, ''), OLD.seq > 1, OLD.billing
           FROM requests r WHERE r.id = OLD.request_id);
    INSERT INTO attempts_hourly (hour, provider, policy, client, model, ingress, class, later, billing, attempts, cost, worst_case)
    SELECT substr(NEW.started_at, 1, 13), NEW.provider, r.policy, r.client, r.model, r.ingress,
           COALESCE(NEW.class, ''), NEW.seq > 1, NEW.billing, 1, NEW.cost, NEW.worst_case
    FROM requests r WHERE r.id = NEW.request_id
    ON CONFLICT (hour, provider, policy, client, model, ingress, class, later, billing) DO UPDATE
    SET attempts = attempts + 1, cost = dadd(cost, excluded.cost), worst_case = dadd(worst_case, excluded.worst_case);
    INSERT INTO attempts_hourly_lean (hour, provider, policy, model, ingress, class, later, billing, attempts, cost, worst_case)
    SELECT substr(NEW.started_at, 1, 13), NEW.provider, r.policy, r.model, r.ingress,
           COALESCE(NEW.class, ''), NEW.seq > 1, NEW.billing, 1, NEW.cost, NEW.worst_case
    FROM requests r WHERE r.id = NEW.request_id
    ON CONFLICT (hour, provider, policy, model, ingress, class, later, billing) DO UPDATE
    SET attempts = attempts + 1, cost = dadd(cost, excluded.cost), worst_case = dadd(worst_case, excluded.worst_case);
END;

CREATE TRIGGER attempts_hourly_delete AFTER DELETE ON attempts BEGIN
    UPDATE attempts_hourly
    SET attempts = attempts - 1, cost = dsub(cost, OLD.cost), worst_case = dsub(worst_case, OLD.worst_case)
    WHERE (hour, provider, policy, client, model, ingress, class, later, billing) =
          (SELECT substr(OLD.started_at, 1, 13), OLD.provider, r.policy, r.client, r.model, r.ingress,
                  COALESCE(OLD.class, ''), OLD.seq > 1, OLD.billing
           FROM requests r WHERE r.id = OLD.request_id);
    DELETE FROM attempts_hourly WHERE attempts = 0;
    UPDATE attempts_hourly_lean
    SET attempts = attempts - 1, cost = dsub(cost, OLD.cost), worst_case = dsub(worst_case, OLD.worst_case)
    WHERE (hour, provider, policy, model, ingress, class, later, billing) =
          (SELECT substr(OLD.started_at, 1, 13), OLD.provider, r.policy, r.model, r.ingress,
                  COALESCE(OLD.class, ''), OLD.seq > 1, OLD.billing
           FROM requests r WHERE r.id = OLD.request_id);
    DELETE FROM attempts_hourly_lean WHERE attempts = 0;
END;

CREATE TRIGGER requests_hourly_insert AFTER INSERT ON requests BEGIN
    INSERT INTO requests_hourly (hour, policy, client, model, ingress, outcome, requests)
    VALUES (substr(NEW.received_at, 1, 13), NEW.policy, NEW.client, NEW.model, NEW.ingress, NEW.outcome, 1)
    ON CONFLICT (hour, policy, client, model, ingress, outcome) DO UPDATE SET requests = requests + 1;
END;

CREATE TRIGGER requests_hourly_update AFTER UPDATE ON requests
WHEN OLD.outcome IS NOT NEW.outcome OR OLD.received_at IS NOT NEW.received_at OR OLD.policy IS NOT NEW.policy
  OR OLD.client IS NOT NEW.client OR OLD.model IS NOT NEW.model OR OLD.ingress IS NOT NEW.ingress
BEGIN
    UPDATE requests_hourly SET requests = requests - 1
    WHERE (hour, policy, client, model, ingress, outcome) =
          (substr(OLD.received_at, 1, 13), OLD.policy, OLD.client, OLD.model, OLD.ingress, OLD.outcome);
    DELETE FROM requests_hourly
    WHERE requests = 0 AND (hour, policy, client, model, ingress, outcome) =
          (substr(OLD.received_at, 1, 13), OLD.policy, OLD.client, OLD.model, OLD.ingress, OLD.outcome);
    INSERT INTO requests_hourly (hour, policy, client, model, ingress, outcome, requests)
    VALUES (substr(NEW.received_at, 1, 13), NEW.policy, NEW.client, NEW.model, NEW.ingress, NEW.outcome, 1)
    ON CONFLICT (hour, policy, client, model, ingress, outcome) DO UPDATE SET requests = requests + 1;
END;

CREATE TRIGGER requests_hourly_delete AFTER DELETE ON requests BEGIN
    UPDATE requests_hourly SET requests = requests - 1
    WHERE (hour, policy, client, model, ingress, outcome) =
          (substr(OLD.received_at, 1, 13), OLD.policy, OLD.client, OLD.model, OLD.ingress, OLD.outcome);
    DELETE FROM requests_hourly WHERE requests = 0;
END;

-- The rollups' deltas batched per group commit (#23), second version. The row triggers of 0009 did a
-- dozen small upserts per request on the writer's group commit, about half of its
-- throughput. Now purser's writer connection, inside each of its transactions, holds a
-- row in `rollup_batching` (inserted after BEGIN, deleted before COMMIT: never
-- committed, so no other connection ever sees it). While it is there, the row triggers
-- below stand aside and the writer's own TEMP triggers (created on its connection only,
-- src/ledger/sqlite/batched.sql) hand each row's delta to functions that add it up in
-- the writer's memory by rollup key; the writer writes one upsert per key just before
-- COMMIT, in the same transaction (src/ledger/sqlite/deltas.rs). Every other connection
-- and path (recovery, an operator's plain sqlite3, migrations) sees no row there and
-- keeps the row-level upserts of 0009, unchanged but for their WHEN, which is plain SQL
-- so that any SQLite connection can prepare a write to these tables.

-- The row triggers of 0009, and on a ledger that ran the first 0011 (see that file)
-- its row triggers and its `_batched` triggers, which called functions purser no
-- longer registers.
DROP TRIGGER IF EXISTS attempts_hourly_insert;
DROP TRIGGER IF EXISTS attempts_hourly_update;
DROP TRIGGER IF EXISTS attempts_hourly_delete;
DROP TRIGGER IF EXISTS requests_hourly_insert;
DROP TRIGGER IF EXISTS requests_hourly_update;
DROP TRIGGER IF EXISTS requests_hourly_delete;
DROP TRIGGER IF EXISTS attempts_hourly_insert_batched;
DROP TRIGGER IF EXISTS attempts_hourly_update_batched;
DROP TRIGGER IF EXISTS attempts_hourly_delete_batched;
DROP TRIGGER IF EXISTS requests_hourly_insert_batched;
DROP TRIGGER IF EXISTS requests_hourly_update_batched;
DROP TRIGGER IF EXISTS requests_hourly_delete_batched;

CREATE TABLE IF NOT EXISTS rollup_batching (
    one INTEGER PRIMARY KEY CHECK (one = 1)
);

-- Row-level, as 0009, where no group commit is batching. Only a change to what the
-- rollup keys or sums moves the row (a reason, a message or tokens do not).
CREATE TRIGGER attempts_hourly_insert AFTER INSERT ON attempts
WHEN NOT EXISTS (SELECT 1 FROM rollup_batching)
BEGIN
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

CREATE TRIGGER attempts_hourly_update AFTER UPDATE ON attempts
WHEN (OLD.class IS NOT NEW.class OR OLD.billing IS NOT NEW.billing OR OLD.cost IS NOT NEW.cost
  OR OLD.worst_case IS NOT NEW.worst_case OR OLD.started_at IS NOT NEW.started_at
  OR OLD.provider IS NOT NEW.provider OR OLD.seq IS NOT NEW.seq OR OLD.request_id IS NOT NEW.request_id)
 AND NOT EXISTS (SELECT 1 FROM rollup_batching)
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

CREATE TRIGGER attempts_hourly_delete AFTER DELETE ON attempts
WHEN NOT EXISTS (SELECT 1 FROM rollup_batching)
BEGIN
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

CREATE TRIGGER requests_hourly_insert AFTER INSERT ON requests
WHEN NOT EXISTS (SELECT 1 FROM rollup_batching)
BEGIN
    INSERT INTO requests_hourly (hour, policy, client, model, ingress, outcome, requests)
    VALUES (substr(NEW.received_at, 1, 13), NEW.policy, NEW.client, NEW.model, NEW.ingress, NEW.outcome, 1)
    ON CONFLICT (hour, policy, client, model, ingress, outcome) DO UPDATE SET requests = requests + 1;
END;

CREATE TRIGGER requests_hourly_update AFTER UPDATE ON requests
WHEN (OLD.outcome IS NOT NEW.outcome OR OLD.received_at IS NOT NEW.received_at OR OLD.policy IS NOT NEW.policy
  OR OLD.client IS NOT NEW.client OR OLD.model IS NOT NEW.model OR OLD.ingress IS NOT NEW.ingress)
 AND NOT EXISTS (SELECT 1 FROM rollup_batching)
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

CREATE TRIGGER requests_hourly_delete AFTER DELETE ON requests
WHEN NOT EXISTS (SELECT 1 FROM rollup_batching)
BEGIN
    UPDATE requests_hourly SET requests = requests - 1
    WHERE (hour, policy, client, model, ingress, outcome) =
          (substr(OLD.received_at, 1, 13), OLD.policy, OLD.client, OLD.model, OLD.ingress, OLD.outcome);
    DELETE FROM requests_hourly WHERE requests = 0;
END;

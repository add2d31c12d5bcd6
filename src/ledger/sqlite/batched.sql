-- The writer connection's own rollup triggers (#23, with migration 0012), created as
-- TEMP triggers when purser opens its writer, so they exist on that connection alone
-- and call functions only it registers (src/ledger/sqlite/deltas.rs). They fire while
-- the writer's transaction holds its `rollup_batching` row, exactly when 0012's row
-- triggers stand aside, and hand over the same deltas: the old row leaves its key, the
-- new row joins its key. The full `attempts_hourly` key is handed over; the lean
-- table's key is the same without the client, which the writer drops when it writes.

CREATE TEMP TRIGGER attempts_hourly_insert_batched AFTER INSERT ON main.attempts
WHEN EXISTS (SELECT 1 FROM main.rollup_batching)
BEGIN
    SELECT purser_rollup_attempt(1, substr(NEW.started_at, 1, 13), NEW.provider, r.policy, r.client, r.model,
                                 r.ingress, COALESCE(NEW.class, ''), NEW.seq > 1, NEW.billing, NEW.cost, NEW.worst_case)
    FROM main.requests r WHERE r.id = NEW.request_id;
END;

CREATE TEMP TRIGGER attempts_hourly_update_batched AFTER UPDATE ON main.attempts
WHEN (OLD.class IS NOT NEW.class OR OLD.billing IS NOT NEW.billing OR OLD.cost IS NOT NEW.cost
  OR OLD.worst_case IS NOT NEW.worst_case OR OLD.started_at IS NOT NEW.started_at
  OR OLD.provider IS NOT NEW.provider OR OLD.seq IS NOT NEW.seq OR OLD.request_id IS NOT NEW.request_id)
 AND EXISTS (SELECT 1 FROM main.rollup_batching)
BEGIN
    SELECT purser_rollup_attempt(-1, substr(OLD.started_at, 1, 13), OLD.provider, r.policy, r.client, r.model,
                                 r.ingress, COALESCE(OLD.class, ''), OLD.seq > 1, OLD.billing, OLD.cost, OLD.worst_case)
    FROM main.requests r WHERE r.id = OLD.request_id;
    SELECT purser_rollup_attempt(1, substr(NEW.started_at, 1, 13), NEW.provider, r.policy, r.client, r.model,
                                 r.ingress, COALESCE(NEW.class, ''), NEW.seq > 1, NEW.billing, NEW.cost, NEW.worst_case)
    FROM main.requests r WHERE r.id = NEW.request_id;
END;

CREATE TEMP TRIGGER attempts_hourly_delete_batched AFTER DELETE ON main.attempts
WHEN EXISTS (SELECT 1 FROM main.rollup_batching)
BEGIN
    SELECT purser_rollup_attempt(-1, substr(OLD.started_at, 1, 13), OLD.provider, r.policy, r.client, r.model,
                                 r.ingress, COALESCE(OLD.class, ''), OLD.seq > 1, OLD.billing, OLD.cost, OLD.worst_case)
    FROM main.requests r WHERE r.id = OLD.request_id;
END;

CREATE TEMP TRIGGER requests_hourly_insert_batched AFTER INSERT ON main.requests
WHEN EXISTS (SELECT 1 FROM main.rollup_batching)
BEGIN
    SELECT purser_rollup_request(1, substr(NEW.received_at, 1, 13), NEW.policy, NEW.client, NEW.model, NEW.ingress, NEW.outcome);
END;

CREATE TEMP TRIGGER requests_hourly_update_batched AFTER UPDATE ON main.requests
WHEN (OLD.outcome IS NOT NEW.outcome OR OLD.received_at IS NOT NEW.received_at OR OLD.policy IS NOT NEW.policy
  OR OLD.client IS NOT NEW.client OR OLD.model IS NOT NEW.model OR OLD.ingress IS NOT NEW.ingress)
 AND EXISTS (SELECT 1 FROM main.rollup_batching)
BEGIN
    SELECT purser_rollup_request(-1, substr(OLD.received_at, 1, 13), OLD.policy, OLD.client, OLD.model, OLD.ingress, OLD.outcome);
    SELECT purser_rollup_request(1, substr(NEW.received_at, 1, 13), NEW.policy, NEW.client, NEW.model, NEW.ingress, NEW.outcome);
END;

CREATE TEMP TRIGGER requests_hourly_delete_batched AFTER DELETE ON main.requests
WHEN EXISTS (SELECT 1 FROM main.rollup_batching)
BEGIN
    SELECT purser_rollup_request(-1, substr(OLD.received_at, 1, 13), OLD.policy, OLD.client, OLD.model, OLD.ingress, OLD.outcome);
END;

-- Version 2: indexes for the audit API (newest-first listing and per-provider filters)
-- and for crash recovery (finding in-flight rows without a scan).

CREATE INDEX requests_by_time ON requests (received_ms DESC, id DESC);
CREATE INDEX requests_by_policy ON requests (policy, received_ms DESC);
CREATE INDEX attempts_by_provider ON attempts (provider, request_id);
CREATE INDEX attempts_in_flight ON attempts (state) WHERE state = 'in_flight';
CREATE INDEX reservations_held ON reservations (state) WHERE state = 'held';

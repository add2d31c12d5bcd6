-- Version 3: what the audit API needs.
--
-- ledger_seq is the order in which requests were committed. `requests` pages newest
-- first by it: a row committed after a page was read always sorts above that page,
-- so paging never skips a request that was admitted slowly, nor shows one twice.
-- (rowid would do the same until a VACUUM renumbers it.)
ALTER TABLE requests ADD COLUMN ledger_seq INTEGER;
UPDATE requests SET ledger_seq = rowid;
CREATE UNIQUE INDEX requests_by_seq ON requests (ledger_seq);
-- Every index is written on each request, so only those that earn their place stay:
-- listing pages by ledger_seq (time filters are checked on the way), and recovery and
-- settlement read in-flight rows with a scan once at start rather than maintain an
-- index that every attempt inserts into and deletes from.
DROP INDEX requests_by_time;
DROP INDEX attempts_in_flight;
DROP INDEX reservations_held;

-- A policy's newest requests, in paging order.
DROP INDEX requests_by_policy;
CREATE INDEX requests_by_policy ON requests (policy, ledger_seq);

-- Provider filters read a request's attempts through the primary key instead, and
-- every index here is written on each attempt.
DROP INDEX attempts_by_provider;

-- spend and attempts.csv select attempts by start time; without this index a
-- one-month window reads every attempt ever made. It also carries what a spend
-- report sums, so a report by provider or day never touches the table.
CREATE INDEX attempts_by_start ON attempts (started_at, provider, billing, cost, worst_case);

-- Version 3: spend and CSV export select attempts by start time; without this index a
-- one-month window scans every attempt ever made.

CREATE INDEX attempts_by_start ON attempts (started_at);

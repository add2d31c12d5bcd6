-- How each answered attempt's cost was reached, what a request holds in its budget
-- windows once a failover topped it up, and a row the readiness probe rewrites.

-- 'usage': the vendor's figures; 'worst_case': usage missing or partial, the missing
-- part charged at its bound; 'estimated': a token class priced without a configured
-- rate. NULL for attempts that were not answered (nothing to price).
ALTER TABLE attempts ADD COLUMN cost_basis TEXT
    CHECK (cost_basis IS NULL OR cost_basis = 'usage' OR cost_basis = 'worst_case' OR cost_basis = 'estimated');

-- What the request holds in each window named by reserved_in; NULL means worst_case
-- (every row written before failover top-ups existed).
ALTER TABLE requests ADD COLUMN reserved_amount TEXT;

CREATE TABLE liveness (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    at TEXT NOT NULL
);

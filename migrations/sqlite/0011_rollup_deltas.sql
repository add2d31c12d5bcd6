-- Version 11 is spent. It was the first version of the batched rollup deltas (#23),
-- whose triggers' WHEN called `purser_rollup_batching()`, a function only purser's
-- connections had, so a plain `sqlite3` could not write to `requests` or `attempts`. It
-- was on main for a few hours before it was reverted (commit 4740c19), so some ledgers
-- may be at version 11 with those triggers. Migration 0012 replaces them on such a
-- ledger and on every other; this version does nothing, so that both kinds of ledger
-- reach 0012 from here.
SELECT 1;

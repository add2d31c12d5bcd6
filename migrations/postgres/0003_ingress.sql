-- purser ledger on PostgreSQL, version 3: which client API each request came in by
-- (DESIGN 6: chat, messages, responses). Rows written before came by chat completions,
-- the only ingress there was.
ALTER TABLE requests ADD COLUMN ingress text NOT NULL DEFAULT 'chat'
    CHECK (ingress IN ('chat', 'messages', 'responses'));
-- No index: every request would pay for it at insert, and an audit filter by ingress
-- rides on the time-range indexes (three values, a filter rather than a lookup).

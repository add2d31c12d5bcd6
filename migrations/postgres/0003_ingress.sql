-- purser ledger on PostgreSQL, version 3: which client API each request came in by
-- (DESIGN 6: chat, messages, responses). Rows written before came by chat completions,
-- the only ingress there was.
ALTER TABLE requests ADD COLUMN ingress text NOT NULL DEFAULT 'chat'
    CHECK (ingress IN ('chat', 'messages', 'responses'));
CREATE INDEX requests_by_ingress ON requests (ingress, received_at);

-- Which client API each request came in by (DESIGN 6: chat, messages, responses).
-- Every row written before this column existed came by chat completions, the only
-- ingress there was.
ALTER TABLE requests ADD COLUMN ingress TEXT NOT NULL DEFAULT 'chat'
    CHECK (ingress IN ('chat', 'messages', 'responses'));
CREATE INDEX requests_by_ingress ON requests (ingress, received_at);

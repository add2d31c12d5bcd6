-- Each attempt's prompt-cache tokens, as the vendor reported them (#22), and the id of
-- the response a vendor stored for a later turn to continue from.
--
-- Cache tokens are parts of input_tokens, priced at their own rates: reads, and writes
-- with their split by cache lifetime where the vendor gives it (Anthropic's 5-minute
-- and 1-hour writes). NULL: not reported (or not answered), which is not a reported 0.
ALTER TABLE attempts ADD COLUMN cache_read_tokens INTEGER CHECK (cache_read_tokens >= 0);
ALTER TABLE attempts ADD COLUMN cache_write_tokens INTEGER CHECK (cache_write_tokens >= 0);
ALTER TABLE attempts ADD COLUMN cache_write_5m_tokens INTEGER CHECK (cache_write_5m_tokens >= 0);
ALTER TABLE attempts ADD COLUMN cache_write_1h_tokens INTEGER CHECK (cache_write_1h_tokens >= 0);

-- The vendor's id of a response it stored (OpenAI Responses without `store: false`): a
-- later `previous_response_id` naming it is bounded by this attempt's recorded tokens.
-- NULL for every other attempt, so the partial index costs nothing on their inserts
-- and updates; Codex (`store: false`) never writes one.
ALTER TABLE attempts ADD COLUMN response_id TEXT;
-- How many output items that response holds: each is framed as a message when the
-- later turn reads it back as input.
ALTER TABLE attempts ADD COLUMN response_items INTEGER CHECK (response_items >= 0);
CREATE INDEX attempts_response_id ON attempts (response_id) WHERE response_id IS NOT NULL;

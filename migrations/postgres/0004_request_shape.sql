-- purser ledger on PostgreSQL, version 4: a request's shape at admission (issue #24),
-- what selection and the ceiling proof read from it, so `purser replay` can run
-- recorded traffic through another plan without the body. Nullable: rows written
-- before have no shape, and a replay counts and skips them. A row has a shape when
-- `shape_choices` is set.
ALTER TABLE requests
    ADD COLUMN shape_input_tokens bigint CHECK (shape_input_tokens >= 0),
    ADD COLUMN shape_requested_output bigint CHECK (shape_requested_output >= 0),
    ADD COLUMN shape_output_bound bigint CHECK (shape_output_bound >= 0),
    ADD COLUMN shape_choices bigint CHECK (shape_choices >= 1),
    ADD COLUMN shape_stream boolean,
    ADD COLUMN shape_tools boolean,
    ADD COLUMN shape_media boolean,
    ADD COLUMN shape_unbounded boolean;
-- No index: a replay reads the requests in commit order (`ledger_seq`, the primary key,
-- the order the budgets saw them), so the admission insert stays as cheap as it was.

-- A request's shape at admission (issue #24): what selection and the ceiling proof
-- read from it, so `purser replay` can run recorded traffic through another plan
-- without the body. Nullable: rows written before have no shape, and a replay counts
-- and skips them. A row has a shape when `shape_choices` is set.
ALTER TABLE requests ADD COLUMN shape_input_tokens INTEGER CHECK (shape_input_tokens >= 0);
ALTER TABLE requests ADD COLUMN shape_requested_output INTEGER CHECK (shape_requested_output >= 0);
ALTER TABLE requests ADD COLUMN shape_output_bound INTEGER CHECK (shape_output_bound >= 0);
ALTER TABLE requests ADD COLUMN shape_choices INTEGER CHECK (shape_choices >= 1);
ALTER TABLE requests ADD COLUMN shape_stream INTEGER CHECK (shape_stream IN (0, 1));
ALTER TABLE requests ADD COLUMN shape_tools INTEGER CHECK (shape_tools IN (0, 1));
ALTER TABLE requests ADD COLUMN shape_media INTEGER CHECK (shape_media IN (0, 1));
ALTER TABLE requests ADD COLUMN shape_unbounded INTEGER CHECK (shape_unbounded IN (0, 1));
-- No index: a replay reads the requests in commit order (`ledger_seq`, the table's own
-- key, the order the budgets saw them), so the admission insert stays as cheap as it was.

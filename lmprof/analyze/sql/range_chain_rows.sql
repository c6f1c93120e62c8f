-- The chain of the _range_chain view (attribution.sql) kept in a table, _range_chain_rows, and
-- the view pointed at it, so that the queries that read it (the per-range tables ranges and
-- range_kernels, whose _op_ranges_wide reads it twice; a kept database's op_ranges) compute the
-- chain once. Run once per trace, by Trace.chain; the views that read _range_chain bind to it by
-- name when they run.
CREATE OR REPLACE TABLE _range_chain_rows AS SELECT * FROM _range_chain;

CREATE OR REPLACE VIEW _range_chain AS SELECT * FROM _range_chain_rows;

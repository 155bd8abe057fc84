-- The takeover of an order whose process died before deciding it. Until now every new order
-- was written with a `drive_order` job due shortly after its deadline, and its decision marked
-- that job done: a row, its index entries and a rewrite per order, for a job that runs only
-- when the process deciding the order is gone. Instead the order carries the time a worker may
-- take it over, cleared when it is decided (or abandoned); claim_due turns the orders whose
-- time has passed into `drive_order` jobs, reading only undecided orders through this index.
-- Orders recorded before this column existed keep their takeover jobs (NULL here).
--
-- Adding a nullable column is instant. Building the index reads the whole table (it indexes
-- nothing yet) and blocks writes to orders meanwhile. On a large table, add the column and
-- build the index first without blocking, then start the new version (which finds both):
--   ALTER TABLE orders ADD COLUMN IF NOT EXISTS takeover_at_ms BIGINT;
--   CREATE INDEX CONCURRENTLY orders_takeover ON orders (takeover_at_ms)
--     WHERE takeover_at_ms IS NOT NULL;
ALTER TABLE orders ADD COLUMN IF NOT EXISTS takeover_at_ms BIGINT;
CREATE INDEX IF NOT EXISTS orders_takeover ON orders (takeover_at_ms) WHERE takeover_at_ms IS NOT NULL;

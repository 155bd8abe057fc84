-- The W3C traceparent of the PlaceOrder that created the order, so the worker's job spans can
-- link to the order's original trace. NULL for orders recorded before this column existed.
ALTER TABLE orders ADD COLUMN traceparent TEXT;

-- Order ids are random per order (so a key reused after retention is a new order with new
-- wallet and inventory references); the idempotency key is unique within its scope instead.
CREATE UNIQUE INDEX orders_scope_key ON orders (scope, idempotency_key);

-- Parking (docs/design.md §6): `attempts` counts every failed attempt (the backoff's exponent);
-- `rejections` counts the definitive refusals `worker.max_attempts` limits; transient failures
-- park only after `worker.park_after`, counted from `failing_since_ms`.
ALTER TABLE jobs ADD COLUMN rejections BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN failing_since_ms BIGINT;

-- Orders and their follow-up jobs (SQLite). Times are epoch milliseconds given by the caller.

CREATE TABLE orders (
    order_id          TEXT    NOT NULL PRIMARY KEY,
    scope             TEXT    NOT NULL,
    idempotency_key   TEXT    NOT NULL,
    request_hash      TEXT    NOT NULL,
    customer_id       TEXT    NOT NULL,
    cart_id           TEXT    NOT NULL,
    wallet_account_id TEXT    NOT NULL,
    expected_currency TEXT,
    expected_minor    INTEGER,
    deadline_ms       INTEGER NOT NULL,
    phase             TEXT    NOT NULL CHECK (phase IN ('RECEIVED', 'HOLD_SENT', 'DECIDED')),
    status            TEXT    NOT NULL CHECK (status IN ('PENDING', 'CONFIRMED', 'DECLINED')),
    reason            TEXT    NOT NULL,
    retryable         INTEGER NOT NULL CHECK (retryable IN (0, 1)),
    retry_after_ms    INTEGER,
    total_currency    TEXT,
    total_minor       INTEGER,
    hold_id           TEXT,
    hold_sent_at_ms   INTEGER,
    fraud_review      INTEGER NOT NULL CHECK (fraud_review IN (0, 1)),
    created_at_ms     INTEGER NOT NULL,
    updated_at_ms     INTEGER NOT NULL,
    CHECK ((expected_currency IS NULL) = (expected_minor IS NULL)),
    CHECK ((total_currency IS NULL) = (total_minor IS NULL))
) STRICT, WITHOUT ROWID;

-- purge_terminal: terminal orders by age (also serves the PENDING count of stats).
CREATE INDEX orders_status_updated ON orders (status, updated_at_ms);

CREATE TABLE jobs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id      TEXT    NOT NULL REFERENCES orders (order_id) ON DELETE CASCADE,
    kind          TEXT    NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('pending', 'done', 'parked')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    run_at_ms     INTEGER NOT NULL,
    lease_owner   TEXT,
    last_error    TEXT,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    UNIQUE (order_id, kind)
) STRICT;

-- claim_due: pending jobs, oldest run_at first (also serves the per-state counts of stats).
CREATE INDEX jobs_state_run_at ON jobs (state, run_at_ms);

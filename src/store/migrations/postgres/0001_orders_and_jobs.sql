-- Orders and their follow-up jobs (PostgreSQL). Times are epoch milliseconds given by the caller.

CREATE TABLE orders (
    order_id          TEXT    NOT NULL PRIMARY KEY,
    scope             TEXT    NOT NULL,
    idempotency_key   TEXT    NOT NULL,
    request_hash      TEXT    NOT NULL,
    customer_id       TEXT    NOT NULL,
    cart_id           TEXT    NOT NULL,
    wallet_account_id TEXT    NOT NULL,
    expected_currency TEXT,
    expected_minor    BIGINT,
    deadline_ms       BIGINT  NOT NULL,
    phase             TEXT    NOT NULL CHECK (phase IN ('RECEIVED', 'HOLD_SENT', 'DECIDED')),
    status            TEXT    NOT NULL CHECK (status IN ('PENDING', 'CONFIRMED', 'DECLINED')),
    reason            TEXT    NOT NULL,
    retryable         BOOLEAN NOT NULL,
    retry_after_ms    BIGINT,
    total_currency    TEXT,
    total_minor       BIGINT,
    hold_id           TEXT,
    hold_sent_at_ms   BIGINT,
    fraud_review      BOOLEAN NOT NULL,
    created_at_ms     BIGINT  NOT NULL,
    updated_at_ms     BIGINT  NOT NULL,
    CHECK ((expected_currency IS NULL) = (expected_minor IS NULL)),
    CHECK ((total_currency IS NULL) = (total_minor IS NULL))
);

-- purge_terminal: terminal orders by age (also serves the PENDING count of stats).
CREATE INDEX orders_status_updated ON orders (status, updated_at_ms);

CREATE TABLE jobs (
    id            BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id      TEXT    NOT NULL REFERENCES orders (order_id) ON DELETE CASCADE,
    kind          TEXT    NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('pending', 'done', 'parked')),
    attempts      BIGINT  NOT NULL DEFAULT 0,
    run_at_ms     BIGINT  NOT NULL,
    lease_owner   TEXT,
    last_error    TEXT,
    created_at_ms BIGINT  NOT NULL,
    updated_at_ms BIGINT  NOT NULL,
    UNIQUE (order_id, kind)
);

-- claim_due: pending jobs, oldest run_at first (also serves the per-state counts of stats).
CREATE INDEX jobs_state_run_at ON jobs (state, run_at_ms);

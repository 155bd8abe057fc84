-- One row the orchestrator rewrites to prove the store accepts writes: at start (a read-only or
-- full store refuses to start) and periodically while running (health turns NOT_SERVING).
CREATE TABLE store_probe (
    id    INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    at_ms BIGINT  NOT NULL
);

-- Idempotency keys: the first response to a POST sent with an `Idempotency-Key`, answered
-- again to a retry with the same key and body for 24 hours. `status` is NULL while the first
-- request is in flight; its claim lapses at `claimed_until` unless renewed, so a replica that
-- died mid-request does not hold the key for ever. Times are Unix milliseconds.
CREATE TABLE idempotency_keys (
    key           TEXT PRIMARY KEY NOT NULL,
    fingerprint   TEXT NOT NULL,
    claim         TEXT NOT NULL,
    claimed_until BIGINT NOT NULL,
    status        INTEGER,
    content_type  TEXT,
    location      TEXT,
    body          BYTEA,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

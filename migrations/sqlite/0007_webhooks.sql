-- Webhooks. `webhook_endpoints` holds the URLs the server was started with (`--webhook-url`;
-- replaced at every start). Every event of a delivered type is queued for each of them in the
-- transaction that commits the event, so a delivery is never lost, whatever stops the process:
-- the trigger `webhook_deliveries_enqueue` on `events` is the cursor over the event log. It is
-- created at start when URLs are configured and dropped when none are (`store/webhooks.rs`),
-- so a server without webhooks pays nothing per event. `webhook_deliveries` is the queue and the
-- delivery log: `status` is pending, delivered or failed (given up after 24 hours of retries);
-- a process delivering a row holds it with `claim` until `claimed_until`. Times are Unix
-- milliseconds.
CREATE TABLE webhook_endpoints (
    url TEXT PRIMARY KEY NOT NULL
);

CREATE TABLE webhook_deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id      TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    event_type      TEXT NOT NULL,
    url             TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending',
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    claim           TEXT,
    claimed_until   BIGINT NOT NULL DEFAULT 0,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    delivered_at    BIGINT,
    UNIQUE (session_id, seq, url)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';

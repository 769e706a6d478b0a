-- Webhooks. `webhook_endpoints` holds the URLs the replicas were started with
-- (`--webhook-url`; replaced at every start). Every event of a delivered type is queued for
-- each of them in the transaction that commits the event, so a delivery is never lost, whatever
-- stops a replica: the trigger `webhook_deliveries_enqueue` on `events` is the cursor over the
-- event log. It is created at start when URLs are configured and dropped when none are
-- (`store/webhooks.rs`), so a server without webhooks pays nothing per event. `webhook_deliveries` is the
-- queue and the delivery log: `status` is pending, delivered or failed (given up after 24 hours
-- of retries); the replica delivering a row holds it with `claim` until `claimed_until`, so one
-- replica delivers each. Times are Unix milliseconds.
CREATE TABLE webhook_endpoints (
    url text PRIMARY KEY NOT NULL
);

CREATE TABLE webhook_deliveries (
    id              bigserial PRIMARY KEY,
    session_id      uuid NOT NULL,
    seq             bigint NOT NULL,
    event_type      text NOT NULL,
    url             text NOT NULL,
    status          text NOT NULL DEFAULT 'pending',
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at bigint NOT NULL,
    claim           text,
    claimed_until   bigint NOT NULL DEFAULT 0,
    last_error      text,
    created_at      bigint NOT NULL,
    delivered_at    bigint,
    UNIQUE (session_id, seq, url)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';

CREATE FUNCTION webhook_deliveries_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (session_id, seq, event_type, url, next_attempt_at, created_at)
    SELECT NEW.session_id, NEW.seq, NEW.type, url,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    FROM webhook_endpoints
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

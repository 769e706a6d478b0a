-- A session's events are stored a row per commit (the events of the session that the commit
-- holds) rather than a row per event: one row and one index entry where a turn's forty-odd
-- events each took a row, a `jsonb` parse and an index entry. A row is keyed by its session and
-- the last `seq` it holds, and `events` is JSON text, an array of `[seq, type, created_at,
-- data]` (see `src/store/event_log.rs`). Rows up to a page's size stay in the table
-- uncompressed (`toast_tuple_target`). The former rows move in place, one event each.
CREATE TABLE event_batches (
    session_id uuid NOT NULL,
    first_seq  bigint NOT NULL,
    last_seq   bigint NOT NULL,
    events     text NOT NULL,
    PRIMARY KEY (session_id, last_seq)
) WITH (toast_tuple_target = 8160);

INSERT INTO event_batches (session_id, first_seq, last_seq, events)
    SELECT session_id, seq, seq, json_build_array(json_build_array(seq, type, created_at, data))::text
      FROM events;

DROP TABLE events;

-- Webhooks: the trigger that queues deliveries (made at start when URLs are configured, see
-- `store/webhooks.rs`) went with the former table; on `event_batches` it runs this function,
-- which queues each event of a delivered type that the row holds.
CREATE OR REPLACE FUNCTION webhook_deliveries_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (session_id, seq, event_type, url, next_attempt_at, created_at)
    SELECT NEW.session_id, e.seq, e.type, w.url,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    FROM (SELECT (value ->> 0)::bigint AS seq, value ->> 1 AS type
            FROM json_array_elements(NEW.events::json)) AS e,
         webhook_endpoints w
    WHERE e.type IN ('agent.finished', 'agent.failed', 'agent.cancelled',
                     'tool.approval-requested', 'tool.client-requested')
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- A session's events are stored a row per commit (the events of the session that the commit
-- holds) rather than a row per event: a turn's forty-odd events had each session in a commit
-- dirty, split and rebalance leaves of its own in the clustered log, half of the pages a turn
-- wrote. A row of `event_batches` is keyed by its session and the last `seq` it holds, and
-- `events` is a JSON array of `[seq, type, created_at, data]` (see `src/store/event_log.rs`).
-- The rowid is the order rows were written in, so new rows of every session fill the same
-- last leaves. The former rows move in place, one event each.
CREATE TABLE event_batches (
    session_id TEXT NOT NULL,
    first_seq  INTEGER NOT NULL,
    last_seq   INTEGER NOT NULL,
    events     TEXT NOT NULL
);

INSERT INTO event_batches (session_id, first_seq, last_seq, events)
    SELECT session_id, seq, seq,
           json_array(json_array(seq, type, created_at,
                                 CASE WHEN json_valid(data) THEN json(data)
                                      ELSE json_quote(data) END))
      FROM events ORDER BY session_id, seq;

DROP TABLE events;

CREATE UNIQUE INDEX event_batches_by_session ON event_batches (session_id, last_seq);

-- Replays: a row per session that replays another one (`POST /v1/sessions/{id}/replay`):
-- its source, its mode, the agent version it runs, how many of the source's turns it
-- replays, and when it ended. Ids are UUID v7 text and times Unix milliseconds, the same on
-- both backends.
CREATE TABLE replays (
    session_id  TEXT PRIMARY KEY NOT NULL,
    source_id   TEXT NOT NULL,
    mode        TEXT NOT NULL,
    agent       TEXT NOT NULL,
    turns       BIGINT NOT NULL,
    created_at  BIGINT NOT NULL,
    finished_at BIGINT
);

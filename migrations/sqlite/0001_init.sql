-- Sessions and everything that happened in them. Ids are UUID v7 text (time-ordered), times are
-- RFC 3339 text in UTC, JSON is text.

CREATE TABLE sessions (
    id            TEXT PRIMARY KEY NOT NULL,
    parent_id     TEXT,
    title         TEXT,
    metadata      TEXT NOT NULL DEFAULT '{}',
    system_prompt TEXT,
    state         TEXT NOT NULL,
    error         TEXT,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    last_run_id   TEXT,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL
);

-- Start-up and takeover look only for sessions whose run was in progress.
CREATE INDEX sessions_active ON sessions (state) WHERE state IN ('running', 'waiting_tool');

-- One row per message; `idx` is the message's index in the session's history.
CREATE TABLE messages (
    session_id   TEXT NOT NULL,
    idx          INTEGER NOT NULL,
    role         TEXT NOT NULL,
    content      TEXT NOT NULL,
    tool_calls   TEXT,
    tool_call_id TEXT,
    created_at   TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
) WITHOUT ROWID;

CREATE TABLE runs (
    id            TEXT PRIMARY KEY NOT NULL,
    session_id    TEXT NOT NULL,
    kind          TEXT NOT NULL,
    status        TEXT NOT NULL,
    input         TEXT,
    text          TEXT,
    finish_reason TEXT,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    steps         INTEGER NOT NULL DEFAULT 0,
    error         TEXT,
    start_seq     INTEGER NOT NULL,
    created_at    TEXT NOT NULL,
    finished_at   TEXT
);
CREATE INDEX runs_by_session ON runs (session_id, id);

CREATE TABLE steps (
    id            TEXT PRIMARY KEY NOT NULL,
    session_id    TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    kind          TEXT NOT NULL,
    status        TEXT NOT NULL,
    request       TEXT NOT NULL,
    response      TEXT,
    input_tokens  INTEGER,
    output_tokens INTEGER,
    error         TEXT,
    created_at    TEXT NOT NULL,
    finished_at   TEXT
);
CREATE INDEX steps_by_session ON steps (session_id, id);

-- The append-only event log; `seq` is contiguous per session from 1.
CREATE TABLE events (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    type       TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

CREATE TABLE checkpoints (
    id            TEXT PRIMARY KEY NOT NULL,
    session_id    TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    step_id       TEXT,
    message_count INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    created_at    TEXT NOT NULL
);
CREATE INDEX checkpoints_by_session ON checkpoints (session_id, id);

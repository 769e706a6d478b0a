-- Sessions and everything that happened in them, for the PostgreSQL (scale-out) store.
-- The same tables, keys and indexes as migrations/sqlite/0001_init.sql, with native types:
-- ids are `uuid` (v7, time-ordered; byte order = the text order SQLite sorts by), JSON is
-- `jsonb`, times are `timestamptz` (microseconds, as the model rounds them), counters `bigint`.

CREATE TABLE sessions (
    id               uuid PRIMARY KEY NOT NULL,
    parent_id        uuid,
    title            text,
    metadata         jsonb NOT NULL DEFAULT '{}',
    system_prompt    text,
    state            text NOT NULL,
    error            text,
    input_tokens     bigint NOT NULL DEFAULT 0,
    output_tokens    bigint NOT NULL DEFAULT 0,
    last_run_id      uuid,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    -- Scale-out: the replica that runs the session holds its lease (owner + expiry, renewed by
    -- heartbeat); `lease_epoch` grows with every takeover so a stale owner's writes can be fenced.
    lease_owner      uuid,
    lease_epoch      bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz
);

-- Start-up and takeover look only for sessions whose run was in progress.
CREATE INDEX sessions_active ON sessions (state) WHERE state IN ('running', 'waiting_tool');

-- One row per message; `idx` is the message's index in the session's history.
CREATE TABLE messages (
    session_id   uuid NOT NULL,
    idx          bigint NOT NULL,
    role         text NOT NULL,
    content      text NOT NULL,
    tool_calls   jsonb,
    tool_call_id text,
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (session_id, idx)
);

CREATE TABLE runs (
    id            uuid PRIMARY KEY NOT NULL,
    session_id    uuid NOT NULL,
    kind          text NOT NULL,
    status        text NOT NULL,
    input         text,
    text          text,
    finish_reason text,
    input_tokens  bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    steps         bigint NOT NULL DEFAULT 0,
    error         text,
    start_seq     bigint NOT NULL,
    created_at    timestamptz NOT NULL,
    finished_at   timestamptz
);
CREATE INDEX runs_by_session ON runs (session_id, id);

CREATE TABLE steps (
    id            uuid PRIMARY KEY NOT NULL,
    session_id    uuid NOT NULL,
    run_id        uuid NOT NULL,
    kind          text NOT NULL,
    status        text NOT NULL,
    request       jsonb NOT NULL,
    response      jsonb,
    input_tokens  bigint,
    output_tokens bigint,
    error         text,
    created_at    timestamptz NOT NULL,
    finished_at   timestamptz
);
CREATE INDEX steps_by_session ON steps (session_id, id);

-- The append-only event log; `seq` is contiguous per session from 1.
CREATE TABLE events (
    session_id uuid NOT NULL,
    seq        bigint NOT NULL,
    type       text NOT NULL,
    data       jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE checkpoints (
    id            uuid PRIMARY KEY NOT NULL,
    session_id    uuid NOT NULL,
    run_id        uuid NOT NULL,
    step_id       uuid,
    message_count bigint NOT NULL,
    seq           bigint NOT NULL,
    created_at    timestamptz NOT NULL
);
CREATE INDEX checkpoints_by_session ON checkpoints (session_id, id);

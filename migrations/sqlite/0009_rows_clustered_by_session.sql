-- Steps, runs and checkpoints are only ever read and written by session (the routes and the
-- actor address them by session and id), so each is stored clustered by (session_id, id):
-- one b-tree instead of a rowid table, its primary-key index and a by-session index. A commit
-- then writes one page per session for each of them rather than up to three.

CREATE TABLE steps_by_session_id (
    id            TEXT NOT NULL,
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
    finished_at   TEXT,
    PRIMARY KEY (session_id, id)
) WITHOUT ROWID;
INSERT INTO steps_by_session_id (id, session_id, run_id, kind, status, request, response,
    input_tokens, output_tokens, error, created_at, finished_at)
SELECT id, session_id, run_id, kind, status, request, response, input_tokens, output_tokens,
    error, created_at, finished_at FROM steps;
DROP TABLE steps;
ALTER TABLE steps_by_session_id RENAME TO steps;

CREATE TABLE runs_by_session_id (
    id            TEXT NOT NULL,
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
    finished_at   TEXT,
    client_tools  TEXT,
    PRIMARY KEY (session_id, id)
) WITHOUT ROWID;
INSERT INTO runs_by_session_id (id, session_id, kind, status, input, text, finish_reason,
    input_tokens, output_tokens, steps, error, start_seq, created_at, finished_at, client_tools)
SELECT id, session_id, kind, status, input, text, finish_reason, input_tokens, output_tokens,
    steps, error, start_seq, created_at, finished_at, client_tools FROM runs;
DROP TABLE runs;
ALTER TABLE runs_by_session_id RENAME TO runs;

CREATE TABLE checkpoints_by_session_id (
    id            TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    step_id       TEXT,
    message_count INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    created_at    TEXT NOT NULL,
    PRIMARY KEY (session_id, id)
) WITHOUT ROWID;
INSERT INTO checkpoints_by_session_id (id, session_id, run_id, step_id, message_count, seq,
    created_at)
SELECT id, session_id, run_id, step_id, message_count, seq, created_at FROM checkpoints;
DROP TABLE checkpoints;
ALTER TABLE checkpoints_by_session_id RENAME TO checkpoints;

-- Remote environments and the tool calls queued for their workers. An environment is a named
-- place where a session's built-in tools run (`local`, the server itself, is built in and not
-- stored); a `workers` environment's calls wait in `worker_calls` until a worker claims one
-- under a lease (a conditional update that bumps `attempts`), renews it by heartbeats, and
-- answers it; the answer is kept until the replica that runs the session has recorded it.
-- Times are Unix microseconds.
CREATE TABLE environments (
    id         TEXT NOT NULL PRIMARY KEY,
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (tenant, name)
);

CREATE TABLE worker_calls (
    session_id  TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    environment TEXT NOT NULL,
    tool        TEXT NOT NULL,
    input       TEXT NOT NULL,
    -- queued | claimed | answered (a result, not yet recorded by the session) | done
    state       TEXT NOT NULL,
    worker      TEXT,
    attempts    BIGINT NOT NULL DEFAULT 0,
    lease_until BIGINT,
    expires_at  BIGINT,
    queued_at   BIGINT NOT NULL,
    -- The result, from its worker or the server (an interrupted `shell` call); is_error 0/1.
    output      TEXT,
    is_error    BIGINT,
    PRIMARY KEY (session_id, call_id)
);
CREATE INDEX worker_calls_open ON worker_calls (tenant, environment, state, queued_at);

-- Artifacts: the files a session's tools produced (write_file, edit_file), as numbered versions
-- of a path. The same tables as migrations/sqlite/0003_artifacts.sql, with native types. The
-- bytes live in `blobs`, once per sha256 whatever the number of versions and sessions that
-- name them; an artifact row names its bytes by their digest.

CREATE TABLE blobs (
    sha256     text PRIMARY KEY NOT NULL,
    size       bigint NOT NULL,
    content    bytea NOT NULL,
    created_at timestamptz NOT NULL
);

CREATE TABLE artifacts (
    session_id    uuid NOT NULL,
    id            uuid NOT NULL,
    path          text NOT NULL,
    version       bigint NOT NULL,
    size          bigint NOT NULL,
    sha256        text NOT NULL,
    media_type    text NOT NULL,
    step_id       uuid NOT NULL,
    run_id        uuid NOT NULL,
    -- Messages in the history when it was recorded: a fork of the first N messages keeps the
    -- artifacts recorded with at most N.
    message_count bigint NOT NULL,
    -- The seq of its artifact.created event.
    seq           bigint NOT NULL,
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (session_id, id)
);
-- Versions count up per (session, path); the newest of a path is found through this index.
CREATE UNIQUE INDEX artifacts_versions ON artifacts (session_id, path, version);
-- Whether any artifact still names some bytes (when a session is deleted).
CREATE INDEX artifacts_by_blob ON artifacts (sha256);

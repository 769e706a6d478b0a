-- Artifacts: the files a session's tools produced (write_file, edit_file), as numbered versions
-- of a path. The bytes live in `blobs`, once per sha256 whatever the number of versions and
-- sessions that name them; an artifact row names its bytes by their digest.

CREATE TABLE blobs (
    sha256     TEXT PRIMARY KEY NOT NULL,
    size       INTEGER NOT NULL,
    content    BLOB NOT NULL,
    created_at TEXT NOT NULL
);

CREATE TABLE artifacts (
    session_id    TEXT NOT NULL,
    id            TEXT NOT NULL,
    path          TEXT NOT NULL,
    version       INTEGER NOT NULL,
    size          INTEGER NOT NULL,
    sha256        TEXT NOT NULL,
    media_type    TEXT NOT NULL,
    step_id       TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    -- Messages in the history when it was recorded: a fork of the first N messages keeps the
    -- artifacts recorded with at most N.
    message_count INTEGER NOT NULL,
    -- The seq of its artifact.created event.
    seq           INTEGER NOT NULL,
    created_at    TEXT NOT NULL,
    PRIMARY KEY (session_id, id)
);
-- Versions count up per (session, path); the newest of a path is found through this index.
CREATE UNIQUE INDEX artifacts_versions ON artifacts (session_id, path, version);
-- Whether any artifact still names some bytes (when a session is deleted).
CREATE INDEX artifacts_by_blob ON artifacts (sha256);

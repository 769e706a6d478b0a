-- Checkpoints clustered by session: one b-tree, read only as a session's latest, instead of a
-- rowid table with two indexes (its id and `checkpoints_by_session`), so that writing one
-- changes one page rather than three.
CREATE TABLE checkpoints_clustered (
    session_id    TEXT NOT NULL,
    id            TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    step_id       TEXT,
    message_count INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    created_at    TEXT NOT NULL,
    PRIMARY KEY (session_id, id)
) WITHOUT ROWID;

INSERT INTO checkpoints_clustered (session_id, id, run_id, step_id, message_count, seq, created_at)
    SELECT session_id, id, run_id, step_id, message_count, seq, created_at FROM checkpoints;

DROP TABLE checkpoints;
ALTER TABLE checkpoints_clustered RENAME TO checkpoints;

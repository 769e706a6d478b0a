-- A session's latest checkpoint, the only one ever read (to resume a run), kept in the session's
-- row instead of a table of its own: a turn's commits update that row anyway (its state, its
-- usage), so recording a checkpoint no longer dirties a page of another b-tree for each session
-- in the commit. The columns are those of the former `checkpoints` table, prefixed.
ALTER TABLE sessions ADD COLUMN checkpoint_id TEXT;
ALTER TABLE sessions ADD COLUMN checkpoint_run_id TEXT;
ALTER TABLE sessions ADD COLUMN checkpoint_step_id TEXT;
ALTER TABLE sessions ADD COLUMN checkpoint_message_count INTEGER;
ALTER TABLE sessions ADD COLUMN checkpoint_seq INTEGER;
ALTER TABLE sessions ADD COLUMN checkpoint_created_at TEXT;

UPDATE sessions SET (checkpoint_id, checkpoint_run_id, checkpoint_step_id,
                     checkpoint_message_count, checkpoint_seq, checkpoint_created_at) =
    (SELECT id, run_id, step_id, message_count, seq, created_at FROM checkpoints c
      WHERE c.session_id = sessions.id ORDER BY id DESC LIMIT 1)
 WHERE EXISTS (SELECT 1 FROM checkpoints c WHERE c.session_id = sessions.id);

DROP TABLE checkpoints;

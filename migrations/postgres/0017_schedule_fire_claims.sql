-- A fire queued behind its schedule's previous run (`overlap: queue`) waits in the fires log,
-- not in a process: when its turn comes, the first replica to move `claimed_until` (Unix ms)
-- from NULL or a past time claims it and starts its run. A claimer that dies before it
-- recorded the run lets its claim run out, and another one takes the fire up again.
ALTER TABLE schedule_fires ADD COLUMN claimed_until BIGINT;
CREATE INDEX schedule_fires_queued ON schedule_fires (id) WHERE outcome = 'queued';

-- The children of a session (its forks and its sub-agents), for GET /v1/sessions?parent_id=.
CREATE INDEX sessions_by_parent ON sessions (parent_id, id) WHERE parent_id IS NOT NULL;

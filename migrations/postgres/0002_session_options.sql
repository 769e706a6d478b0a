-- What a session chose at creation beyond its prompt: the tools it is offered, its own policy
-- rules (and those "always" answers added), the tools its client runs. One JSON object.
ALTER TABLE sessions ADD COLUMN options JSONB NOT NULL DEFAULT '{}';

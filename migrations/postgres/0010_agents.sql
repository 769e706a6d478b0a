-- Agents: named, versioned configurations that sessions run. A row per agent holds its latest
-- version, the name of that version and whether it is archived; a row per version holds what
-- the version captures (model, prompt, tools, MCP servers, policy, client tools, limits) as
-- JSON. Versions are never changed or deleted: sessions pinned to one keep running it. Ids are
-- UUID v7 text and times Unix microseconds, the same on both backends.
CREATE TABLE agents (
    id          TEXT PRIMARY KEY NOT NULL,
    version     BIGINT NOT NULL,
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    archived_at BIGINT
);
CREATE INDEX agents_by_name ON agents (name);

CREATE TABLE agent_versions (
    agent_id   TEXT NOT NULL,
    version    BIGINT NOT NULL,
    spec       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (agent_id, version)
);

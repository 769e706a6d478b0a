-- Principals and tenants (SPEC §17). Every session and agent belongs to a tenant; a session also
-- records the principal that made it (`owner`). Rows made before tenants existed belong to the
-- `default` tenant, with no owner: operators (the deployment tokens) reach them as before.
ALTER TABLE sessions ADD COLUMN tenant text NOT NULL DEFAULT 'default';
ALTER TABLE sessions ADD COLUMN owner TEXT;
CREATE INDEX sessions_by_tenant ON sessions (tenant, id);
ALTER TABLE agents ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
CREATE INDEX agents_by_tenant ON agents (tenant, id);

-- API keys: the store keeps the SHA-256 (hex) of a key, never the key. A revoked key keeps its
-- row (its id stays recorded as the owner of sessions and the author of answers). Times are
-- Unix milliseconds.
CREATE TABLE api_keys (
    id         TEXT PRIMARY KEY NOT NULL,
    hash       TEXT NOT NULL UNIQUE,
    tenant     TEXT NOT NULL,
    role       TEXT NOT NULL,
    name       TEXT,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant, id);

-- Session tokens for browsers: one session, a scope, an expiry; found by the SHA-256 (hex) of
-- the token. `issuer` is the principal that made it.
CREATE TABLE session_tokens (
    hash       TEXT PRIMARY KEY NOT NULL,
    session_id TEXT NOT NULL,
    scope      TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    issuer     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX session_tokens_expiry ON session_tokens (expires_at);

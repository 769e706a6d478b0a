-- Sign-ins of the built-in page: one row per `tah_token` cookie handed out. `id` is the
-- SHA-256 (hex) of the cookie's random value, which is never stored; `token_binding` ties the
-- sign-in to the API token it was traded for (SHA-256 of the cookie's value and the token), so
-- a token removed from the configuration invalidates its cookies and the table reveals
-- nothing of the tokens. A row is deleted by signing out, and forgotten once it expired.
-- Times are Unix milliseconds.
CREATE TABLE sign_ins (
    id            TEXT PRIMARY KEY NOT NULL,
    token_binding TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL
);
CREATE INDEX sign_ins_expiry ON sign_ins (expires_at);

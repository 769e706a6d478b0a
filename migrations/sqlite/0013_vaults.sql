-- Vault secrets: a row per secret of a tenant's vault. The value is never stored: only what
-- the server sealed under its master key (XChaCha20-Poly1305), a random 24-byte nonce and the
-- ciphertext with its tag, bound to the row's tenant, vault and name. Times are Unix
-- microseconds.
CREATE TABLE vault_secrets (
    tenant     TEXT NOT NULL,
    vault      TEXT NOT NULL,
    name       TEXT NOT NULL,
    nonce      BLOB NOT NULL,
    ciphertext BLOB NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, vault, name)
);

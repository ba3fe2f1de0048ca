-- Users' provider credentials (issue 17): the key only as an AEAD ciphertext
-- with its nonce and the id of the master key that encrypted it.
CREATE TABLE credentials (
    id          BLOB PRIMARY KEY,
    user_id     TEXT NOT NULL,
    provider    TEXT NOT NULL,
    name        TEXT NOT NULL,
    base_url    TEXT,
    key_id      TEXT NOT NULL,
    nonce       BLOB NOT NULL,
    ciphertext  BLOB NOT NULL,
    is_default  INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER,
    UNIQUE (user_id, provider, name)
);
CREATE UNIQUE INDEX credentials_one_default ON credentials (user_id, provider) WHERE is_default = 1;

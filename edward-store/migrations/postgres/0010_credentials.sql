-- Users' provider credentials (issue 17): the key only as an AEAD ciphertext
-- with its nonce and the id of the master key that encrypted it.
CREATE TABLE edward_credentials (
    id          uuid PRIMARY KEY,
    user_id     text NOT NULL,
    provider    text NOT NULL,
    name        text NOT NULL,
    base_url    text,
    key_id      text NOT NULL,
    nonce       bytea NOT NULL,
    ciphertext  bytea NOT NULL,
    is_default  boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL,
    revoked_at  timestamptz,
    UNIQUE (user_id, provider, name)
);
CREATE UNIQUE INDEX edward_credentials_one_default
    ON edward_credentials (user_id, provider) WHERE is_default;

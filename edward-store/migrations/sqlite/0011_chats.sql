-- Chats (issue 10). A chat's messages, kept apart from run events: the
-- user's prompt and each turn's visible reply with its side effects (JSON).
-- Run ids are time-ordered UUID v7 blobs, so (run_id, turn, idx) is
-- conversation order.
CREATE TABLE chat_messages (
    run_id  BLOB NOT NULL,
    user_id TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    turn    INTEGER NOT NULL,
    idx     INTEGER NOT NULL,
    role    TEXT NOT NULL,
    text    TEXT NOT NULL,
    effects TEXT,
    at      INTEGER NOT NULL,
    PRIMARY KEY (run_id, turn, idx)
) WITHOUT ROWID;
CREATE INDEX chat_messages_chat ON chat_messages (user_id, chat_id, run_id, turn, idx);

-- A run's build jobs: queued → building → succeeded | failed, claimed by
-- compare-and-set on (status, claim_fence). `command` is a JSON array.
CREATE TABLE builds (
    run_id      BLOB NOT NULL,
    number      INTEGER NOT NULL,
    status      TEXT NOT NULL,
    command     TEXT NOT NULL,
    claimed_by  TEXT,
    claim_fence INTEGER NOT NULL DEFAULT 0,
    exit_code   INTEGER,
    output      TEXT,
    duration_ms INTEGER,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (run_id, number)
) WITHOUT ROWID;

-- The per-chat admission limit counts one user's chat: (user_id, chat_id).
DROP INDEX runs_active_chat;
CREATE INDEX runs_active_user_chat ON runs (user_id, chat_id) WHERE status IN ('queued', 'running');

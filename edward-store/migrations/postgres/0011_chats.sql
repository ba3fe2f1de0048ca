-- Chats (issue 10). A chat's messages, kept apart from run events: the
-- user's prompt and each turn's visible reply with its side effects.
-- Run ids are time-ordered UUID v7s, so (run_id, turn, idx) is
-- conversation order.
CREATE TABLE edward_chat_messages (
    run_id  uuid NOT NULL,
    user_id text NOT NULL,
    chat_id text NOT NULL,
    turn    integer NOT NULL,
    idx     integer NOT NULL,
    role    text NOT NULL,
    text    text NOT NULL,
    effects json,
    at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, turn, idx)
);
CREATE INDEX edward_chat_messages_chat
    ON edward_chat_messages (user_id, chat_id, run_id, turn, idx);

-- A run's build jobs: queued → building → succeeded | failed, claimed by
-- compare-and-set on (status, claim_fence).
CREATE TABLE edward_builds (
    run_id      uuid NOT NULL,
    number      integer NOT NULL,
    status      text NOT NULL,
    command     json NOT NULL,
    claimed_by  text,
    claim_fence bigint NOT NULL DEFAULT 0,
    exit_code   integer,
    output      text,
    duration_ms bigint,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, number)
);

-- The per-chat admission limit counts one user's chat: (user_id, chat_id).
DROP INDEX edward_runs_active_chat;
CREATE INDEX edward_runs_active_user_chat
    ON edward_runs (user_id, chat_id) WHERE status IN ('queued', 'running');

-- Edward durable store on Postgres. JSON columns are `json` (not `jsonb`):
-- they are stored and returned as written, never queried into, and `json`
-- accepts the `\u0000` escape that model output may contain.

CREATE TABLE edward_runs (
    id              uuid PRIMARY KEY,
    user_id         text NOT NULL,
    chat_id         text NOT NULL,
    status          text NOT NULL,
    request         json NOT NULL,
    fence           bigint NOT NULL DEFAULT 0,
    last_seq        bigint NOT NULL DEFAULT 0,
    checkpoint_turn integer,
    checkpoint      json,
    terminal_reason text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);

CREATE INDEX edward_runs_status_created ON edward_runs (status, created_at, id);
CREATE INDEX edward_runs_active_user ON edward_runs (user_id) WHERE status IN ('queued', 'running');
CREATE INDEX edward_runs_active_chat ON edward_runs (chat_id) WHERE status IN ('queued', 'running');
CREATE INDEX edward_runs_active ON edward_runs (id) WHERE status IN ('queued', 'running');

CREATE TABLE edward_run_events (
    run_id  uuid NOT NULL,
    seq     bigint NOT NULL,
    kind    text NOT NULL,
    at      timestamptz NOT NULL,
    payload json NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE edward_effects (
    run_id     uuid NOT NULL,
    key        text NOT NULL,
    state      text NOT NULL,
    request    json NOT NULL,
    result     json,
    attempts   integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, key)
);

-- Fences: strictly increasing across all claims of all runs.
CREATE SEQUENCE edward_fence_seq;

-- One row per queued job. `seq` orders jobs enqueued at the same instant.
CREATE TABLE edward_queue (
    seq              bigserial UNIQUE,
    run_id           uuid PRIMARY KEY,
    attempts         integer NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    owner            text,
    fence            bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    last_error       text,
    dead_lettered_at timestamptz
);

CREATE INDEX edward_queue_ready ON edward_queue (run_at, seq) WHERE dead_lettered_at IS NULL;
CREATE INDEX edward_queue_dead ON edward_queue (dead_lettered_at) WHERE dead_lettered_at IS NOT NULL;

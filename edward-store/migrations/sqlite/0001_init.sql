-- Edward durable store on SQLite. Times are microseconds since the Unix epoch
-- (INTEGER), JSON is TEXT, ids are 16-byte UUID blobs.

CREATE TABLE runs (
    id              BLOB PRIMARY KEY NOT NULL,
    user_id         TEXT NOT NULL,
    chat_id         TEXT NOT NULL,
    status          TEXT NOT NULL,
    request         TEXT NOT NULL,
    fence           INTEGER NOT NULL DEFAULT 0,
    last_seq        INTEGER NOT NULL DEFAULT 0,
    checkpoint_turn INTEGER,
    checkpoint      TEXT,
    terminal_reason TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    finished_at     INTEGER
);

CREATE INDEX runs_status_created ON runs (status, created_at, id);
CREATE INDEX runs_active_user ON runs (user_id) WHERE status IN ('queued', 'running');
CREATE INDEX runs_active_chat ON runs (chat_id) WHERE status IN ('queued', 'running');

CREATE TABLE run_events (
    run_id  BLOB NOT NULL,
    seq     INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    at      INTEGER NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE effects (
    run_id     BLOB NOT NULL,
    key        TEXT NOT NULL,
    state      TEXT NOT NULL,
    request    TEXT NOT NULL,
    result     TEXT,
    attempts   INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;

-- One row per queued job. `seq` orders jobs enqueued in the same microsecond.
CREATE TABLE queue (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id           BLOB NOT NULL UNIQUE,
    attempts         INTEGER NOT NULL DEFAULT 0,
    run_at           INTEGER NOT NULL,
    owner            TEXT,
    fence            INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    last_error       TEXT,
    dead_lettered_at INTEGER
);

CREATE INDEX queue_ready ON queue (run_at, seq) WHERE dead_lettered_at IS NULL;
CREATE INDEX queue_dead ON queue (dead_lettered_at) WHERE dead_lettered_at IS NOT NULL;

-- The fence counter: strictly increasing across all claims.
CREATE TABLE fence_counter (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT INTO fence_counter (id, value) VALUES (1, 0);

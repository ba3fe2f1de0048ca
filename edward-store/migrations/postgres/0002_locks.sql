-- Owner-checked lease locks (`PgLock`): one row per held lock.
CREATE TABLE edward_locks (
    name       text PRIMARY KEY,
    owner      text NOT NULL,
    token      text NOT NULL,
    expires_at timestamptz NOT NULL
);

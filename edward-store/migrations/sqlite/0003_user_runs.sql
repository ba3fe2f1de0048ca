-- A user's runs, newest first (ids are time-ordered UUID v7 blobs): RunStore::list_user_runs.
CREATE INDEX runs_user_id ON runs (user_id, id);

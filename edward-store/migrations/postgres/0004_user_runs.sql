-- A user's runs, newest first (ids are time-ordered UUID v7s): RunStore::list_user_runs.
CREATE INDEX edward_runs_user_id ON edward_runs (user_id, id);

-- A chat's runs, newest first (RunStore::list_user_runs with a chat filter:
-- a run's start asks for its chat's queued and running runs).
CREATE INDEX edward_runs_user_chat_id ON edward_runs (user_id, chat_id, id);

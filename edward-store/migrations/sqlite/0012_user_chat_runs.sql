-- A chat's runs, newest first (RunStore::list_user_runs with a chat filter:
-- a run's start asks for its chat's queued and running runs).
CREATE INDEX runs_user_chat_id ON runs (user_id, chat_id, id);

-- Durable cancel requests (Engine::cancel): when one was first recorded.
ALTER TABLE edward_runs ADD COLUMN cancel_requested_at timestamptz;

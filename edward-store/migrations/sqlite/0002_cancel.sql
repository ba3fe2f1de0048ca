-- Durable cancel requests (Engine::cancel): when one was first recorded.
ALTER TABLE runs ADD COLUMN cancel_requested_at INTEGER;

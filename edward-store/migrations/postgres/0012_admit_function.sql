-- Admission in one round trip (PgStore::admit). The same steps as the
-- transaction it replaces — take the user's and the chat's advisory locks
-- (keys passed in ascending order), count the active runs of the chat, the
-- user and all users, then insert the run, its first event and its queue
-- row — but inside the server: the locks are held for the time the server
-- needs, not for seven client round trips (which, on a busy client, made
-- every admission of one user wait for the previous one's scheduling).
--
-- A VOLATILE function takes a fresh snapshot for each statement, so the
-- counts, taken after the locks are granted, see every admission that
-- committed before (READ COMMITTED), as the old second statement did.
CREATE FUNCTION edward_admit(
    p_id uuid,
    p_user text,
    p_chat text,
    p_request text,
    p_kind text,
    p_payload text,
    p_lock_first bigint,
    p_lock_second bigint,
    p_per_chat bigint,
    p_per_user bigint,
    p_global bigint
) RETURNS TABLE (outcome text, created timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n bigint;
    at timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(p_lock_first);
    PERFORM pg_advisory_xact_lock(p_lock_second);
    IF EXISTS (SELECT 1 FROM edward_runs WHERE id = p_id) THEN
        RETURN QUERY SELECT 'exists'::text, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM edward_runs
        WHERE user_id = p_user AND chat_id = p_chat AND status IN ('queued', 'running');
    IF n >= p_per_chat THEN
        RETURN QUERY SELECT 'chat'::text, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM edward_runs
        WHERE user_id = p_user AND status IN ('queued', 'running');
    IF n >= p_per_user THEN
        RETURN QUERY SELECT 'user'::text, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM edward_runs WHERE status IN ('queued', 'running');
    IF n >= p_global THEN
        RETURN QUERY SELECT 'global'::text, NULL::timestamptz;
        RETURN;
    END IF;
    INSERT INTO edward_runs (id, user_id, chat_id, status, request, fence, last_seq)
        VALUES (p_id, p_user, p_chat, 'queued', p_request::json, 0, 1)
        RETURNING created_at INTO at;
    INSERT INTO edward_run_events (run_id, seq, kind, at, payload)
        VALUES (p_id, 1, p_kind, at, p_payload::json);
    INSERT INTO edward_queue (run_id) VALUES (p_id) ON CONFLICT (run_id) DO NOTHING;
    RETURN QUERY SELECT 'admitted'::text, at;
END
$$;

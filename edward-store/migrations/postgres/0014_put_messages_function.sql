-- A turn's chat messages in one round trip (PgStore::put_messages): the
-- same steps as the transaction it replaces — share-lock the run's row
-- (a take-over's fence change waits, and a stale writer sees the new
-- fence), check the fence, replace the turn's messages and later ones —
-- run inside the server. Called at the start and end of every turn, the
-- five round trips (BEGIN, SELECT … FOR SHARE, DELETE, INSERT, COMMIT)
-- were a third of a finishing run's statements when a thousand runs ended
-- together.
--
-- Returns the run's fence (NULL: no such run). Nothing is written when it
-- is newer than p_fence; the caller reports the stale fence.
CREATE FUNCTION edward_put_messages(
    p_run uuid,
    p_fence bigint,
    p_turn integer,
    p_roles text[],
    p_texts text[],
    p_effects text[]
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r record;
BEGIN
    SELECT fence, user_id, chat_id INTO r FROM edward_runs WHERE id = p_run FOR SHARE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF r.fence > p_fence THEN
        RETURN r.fence;
    END IF;
    DELETE FROM edward_chat_messages WHERE run_id = p_run AND turn >= p_turn;
    INSERT INTO edward_chat_messages (run_id, user_id, chat_id, turn, idx, role, text, effects)
        SELECT p_run, r.user_id, r.chat_id, p_turn, (t.ord - 1)::integer, t.role, t.text,
               t.effects::json
        FROM unnest(p_roles, p_texts, p_effects) WITH ORDINALITY AS t(role, text, effects, ord);
    RETURN r.fence;
END
$$;

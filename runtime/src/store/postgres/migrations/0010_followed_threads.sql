-- A thread someone follows from another process (an MCP call, an event stream, a queued
-- `run`) is told of each append the moment it commits, rather than found by polling: its
-- follower sets `followed_until` (and keeps moving it while it follows), and the append of a
-- followed thread sends an empty notification on the thread's live channel, the one its
-- model's live text goes out on. The column is read from the row the append updates anyway:
-- an unfollowed thread's append costs nothing more, and a follower that died stops being
-- notified when its time runs out.

ALTER TABLE threads ADD COLUMN followed_until timestamptz;

-- As 0007's, with the notification.
CREATE OR REPLACE FUNCTION append_records(
    p_id text, p_token bigint, p_lines text[],
    p_status text, p_steps bigint, p_return_code integer, p_ended_ms bigint,
    p_waiting_role text, p_paused_at_ms bigint, p_tokens bigint, p_cost_usd double precision,
    p_calls text[], p_log text[], p_listing bytea
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    first_seq integer;
    followed timestamptz;
BEGIN
    UPDATE uncaged_workflow.threads
    SET next_seq = next_seq + cardinality(p_lines),
        status = p_status, steps = p_steps, return_code = p_return_code, ended_ms = p_ended_ms,
        waiting_role = p_waiting_role, paused_at_ms = p_paused_at_ms, tokens = p_tokens,
        cost_usd = p_cost_usd, listing = p_listing
    WHERE id = p_id AND lease_token = p_token
    RETURNING next_seq - cardinality(p_lines), followed_until INTO first_seq, followed;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    INSERT INTO uncaged_workflow.thread_records (thread, seq, line)
        SELECT p_id, first_seq + s.i - 1, s.line
        FROM unnest(p_lines) WITH ORDINALITY AS s(line, i);
    INSERT INTO uncaged_workflow.thread_calls (thread, line)
        SELECT p_id, s.line FROM unnest(p_calls) WITH ORDINALITY AS s(line, i) ORDER BY s.i;
    INSERT INTO uncaged_workflow.thread_log (thread, line)
        SELECT p_id, s.line FROM unnest(p_log) WITH ORDINALITY AS s(line, i) ORDER BY s.i;
    IF followed > now() THEN
        PERFORM pg_notify('uncaged_live_' || lower(p_id), 'stored');
    END IF;
    RETURN cardinality(p_lines);
END
$$;

-- A thread's append as a function: the statement a worker sends for each step is then a call,
-- parsed and planned in microseconds, while the function's own statements are planned once
-- per server connection and kept (a plain statement with these four parts was parsed and
-- planned again for every step: a fifth of a step's time). It works through a transaction
-- pooler too, which a prepared statement does not.
--
-- Appends `lines` to thread `p_id`'s records, with the calls and log lines gathered since its
-- last record, and updates its listing summary: only if it still carries lease token
-- `p_token`. Returns how many records it wrote: 0 if the lease was taken over.

CREATE FUNCTION append_records(
    p_id text, p_token bigint, p_lines text[],
    p_status text, p_steps bigint, p_return_code integer, p_ended_ms bigint,
    p_waiting_role text, p_paused_at_ms bigint, p_tokens bigint, p_cost_usd double precision,
    p_calls text[], p_log text[]
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    first_seq integer;
BEGIN
    UPDATE uncaged_workflow.threads
    SET next_seq = next_seq + cardinality(p_lines),
        status = p_status, steps = p_steps, return_code = p_return_code, ended_ms = p_ended_ms,
        waiting_role = p_waiting_role, paused_at_ms = p_paused_at_ms, tokens = p_tokens,
        cost_usd = p_cost_usd
    WHERE id = p_id AND lease_token = p_token
    RETURNING next_seq - cardinality(p_lines) INTO first_seq;
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
    RETURN cardinality(p_lines);
END
$$;

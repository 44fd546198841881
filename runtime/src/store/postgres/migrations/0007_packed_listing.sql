-- Each thread's listing summary packed in one value, `listing` (postcard bytes whose first byte
-- is their layout), beside the columns of 0005 that stay for operators' queries: listing
-- 100,000 threads, the server sends one value a row where it sent seventeen, and turning the
-- columns into messages was most of the listing's time. Rows without one (older rows, and rows
-- a process of the previous version writes) are listed from their columns.

ALTER TABLE threads ADD COLUMN listing bytea;

-- The append of this version: as 0006's, with the packed summary `p_listing`.
CREATE FUNCTION append_records(
    p_id text, p_token bigint, p_lines text[],
    p_status text, p_steps bigint, p_return_code integer, p_ended_ms bigint,
    p_waiting_role text, p_paused_at_ms bigint, p_tokens bigint, p_cost_usd double precision,
    p_calls text[], p_log text[], p_listing bytea
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    first_seq integer;
BEGIN
    UPDATE uncaged_workflow.threads
    SET next_seq = next_seq + cardinality(p_lines),
        status = p_status, steps = p_steps, return_code = p_return_code, ended_ms = p_ended_ms,
        waiting_role = p_waiting_role, paused_at_ms = p_paused_at_ms, tokens = p_tokens,
        cost_usd = p_cost_usd, listing = p_listing
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

-- The append of a process of the previous version, still running when this migration lands:
-- it updates the columns and cannot pack, so it clears the packed value, and the listing reads
-- that thread's columns rather than a summary left behind.
CREATE OR REPLACE FUNCTION append_records(
    p_id text, p_token bigint, p_lines text[],
    p_status text, p_steps bigint, p_return_code integer, p_ended_ms bigint,
    p_waiting_role text, p_paused_at_ms bigint, p_tokens bigint, p_cost_usd double precision,
    p_calls text[], p_log text[]
) RETURNS bigint LANGUAGE sql AS $$
    SELECT uncaged_workflow.append_records(p_id, p_token, p_lines, p_status, p_steps,
        p_return_code, p_ended_ms, p_waiting_role, p_paused_at_ms, p_tokens, p_cost_usd,
        p_calls, p_log, NULL::bytea)
$$;

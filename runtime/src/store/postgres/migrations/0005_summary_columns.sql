-- A thread's listing summary as columns of its row, where it was one jsonb value: a listing of
-- every thread then sends typed values as they are stored, where each summary was rendered to
-- JSON text by the server and parsed back by the client (most of the time of listing 100,000
-- threads), and an operator can ask `WHERE status = 'waiting'`. The thread's id and bundle
-- were columns already.

ALTER TABLE threads
    ADD COLUMN name          text,
    ADD COLUMN status        text,             -- at rest; a live lease makes it running
    ADD COLUMN steps         bigint,
    ADD COLUMN started_ms    bigint,
    ADD COLUMN prompt        text,             -- its start, as listings show it
    ADD COLUMN return_code   integer,
    ADD COLUMN ended_ms      bigint,
    ADD COLUMN waiting_role  text,
    ADD COLUMN paused_at_ms  bigint,
    ADD COLUMN schedule      text,
    ADD COLUMN tokens        bigint,
    ADD COLUMN cost_usd      double precision,
    ADD COLUMN parent        text;

UPDATE threads SET
    name = summary->>'name',
    status = summary->>'status',
    steps = (summary->>'steps')::bigint,
    started_ms = (summary->>'timestamp')::bigint,
    prompt = summary->>'prompt',
    return_code = (summary->>'returnCode')::integer,
    ended_ms = (summary->>'ended')::bigint,
    waiting_role = summary->>'waitingRole',
    paused_at_ms = (summary->>'pausedAt')::bigint,
    schedule = summary->>'schedule',
    tokens = coalesce((summary->>'tokens')::bigint, 0),
    cost_usd = (summary->>'costUsd')::double precision,
    parent = summary->>'parent';

ALTER TABLE threads
    ALTER COLUMN name SET NOT NULL,
    ALTER COLUMN status SET NOT NULL,
    ALTER COLUMN steps SET NOT NULL,
    ALTER COLUMN started_ms SET NOT NULL,
    ALTER COLUMN prompt SET NOT NULL,
    ALTER COLUMN tokens SET NOT NULL,
    DROP COLUMN summary;

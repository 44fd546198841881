-- Schedules, shared by every machine: any `serve` or `schedule tick` connected to the store
-- fires them, one process at a time (a session advisory lock), exactly once per cron instant
-- or poll item.

-- Each schedule's definition (the JSON `schedules/<NAME>/schedule.json` holds in a home) and
-- its poll's last check (`poll.json`).
CREATE TABLE schedules (
    name        text PRIMARY KEY,
    definition  jsonb NOT NULL,
    poll_state  jsonb
);

-- The firing log, append-only (`firings.jsonl`): each event as the JSON a line of that file
-- holds. Rows are appended by the one process holding the firing lock, so `id` order is
-- commit order, and a reader continues from the last id it saw.
CREATE TABLE schedule_firings (
    id          bigserial PRIMARY KEY,
    schedule    text NOT NULL REFERENCES schedules (name) ON DELETE CASCADE,
    event       jsonb NOT NULL,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schedule_firings_by_schedule ON schedule_firings (schedule, id);

-- A column 0001 made for removals, which delete a thread's row in one statement instead.
ALTER TABLE threads DROP COLUMN removing;

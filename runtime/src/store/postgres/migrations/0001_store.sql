-- The whole store of uncaged-workflow in one PostgreSQL schema. Thread records, calls and
-- debug log lines are kept as the exact JSON lines the home directory's files hold, so that
-- both stores print the same thing; the columns beside them are what queries select on.

-- The registry: each workflow's current version, and the versions it had before.
CREATE TABLE workflows (
    name        text PRIMARY KEY,
    hash        text NOT NULL,
    since_ms    bigint NOT NULL
);
CREATE TABLE workflow_history (
    name        text NOT NULL REFERENCES workflows (name) ON DELETE CASCADE,
    position    integer NOT NULL,          -- 0 = the most recent earlier version
    hash        text NOT NULL,
    since_ms    bigint NOT NULL,
    PRIMARY KEY (name, position)
);

-- Bundles by id (XXH64), with the SHA-256 that vouches for their bytes.
CREATE TABLE bundles (
    hash        text PRIMARY KEY,
    sha256      text NOT NULL,
    size        bigint NOT NULL,
    summary     text,
    descriptor  text NOT NULL,             -- YAML, as `bundles/<HASH>.yaml`
    bytes       bytea NOT NULL,
    added_at    timestamptz NOT NULL DEFAULT now()
);

-- One row per thread: what listings show, and who runs it.
CREATE TABLE threads (
    id           text PRIMARY KEY,         -- ULID: sorts by creation
    bundle       text NOT NULL,
    summary      jsonb NOT NULL,           -- a ThreadSummary, kept current by every append
    next_seq     integer NOT NULL,         -- the sequence number of the next record
    -- The queue: a thread to run, and how (agent overrides), until a worker takes it.
    runnable     boolean NOT NULL DEFAULT false,
    run_request  jsonb,
    queued_at    timestamptz,
    -- The lease: the process that runs it, until when, and the token that fences its writes.
    lease_owner  text,
    lease_until  timestamptz,
    lease_token  bigint NOT NULL DEFAULT 0,
    -- What the thread is doing now (role, agent, since), for `ps`.
    activity     jsonb,
    -- A request to the process that runs it: 'kill' or 'pause'.
    control      text,
    removing     boolean NOT NULL DEFAULT false
);
CREATE INDEX threads_runnable ON threads (queued_at) WHERE runnable;
CREATE INDEX threads_lease_owner ON threads (lease_owner) WHERE lease_owner IS NOT NULL;

-- A thread's records: start (0), steps, pause markers, end, each the JSON line of the file.
CREATE TABLE thread_records (
    thread      text NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    seq         integer NOT NULL,
    line        text NOT NULL,
    PRIMARY KEY (thread, seq)
);

-- The call journal: each agent call's answer, replayed when a thread continues.
CREATE TABLE thread_calls (
    thread      text NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    seq         bigint GENERATED ALWAYS AS IDENTITY,
    line        text NOT NULL,
    PRIMARY KEY (thread, seq)
);

-- The debug log.
CREATE TABLE thread_log (
    thread      text NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    seq         bigint GENERATED ALWAYS AS IDENTITY,
    line        text NOT NULL,
    PRIMARY KEY (thread, seq)
);

-- Worker processes, with their last heartbeat.
CREATE TABLE workers (
    id           text PRIMARY KEY,
    host         text NOT NULL,
    pid          integer NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    max_threads  integer NOT NULL
);

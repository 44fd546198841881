-- Signed one-time links: a row per link, keyed by its token's SHA-256 (the token is never
-- kept), the link as JSON; `unapplied` marks a use whose decision is not yet applied.
CREATE TABLE links (
    hash text PRIMARY KEY,
    thread_id text NOT NULL,
    link text NOT NULL,
    unapplied boolean NOT NULL DEFAULT false,
    expires_ms bigint NOT NULL
);
CREATE INDEX links_thread ON links (thread_id);
CREATE INDEX links_unapplied ON links (hash) WHERE unapplied;

-- Deliveries of waits to `notify:` channels: a row per wait, channel and recipient, claimed
-- by one server at a time (the notice as JSON, its lease and attempts in it).
CREATE TABLE notices (
    key text PRIMARY KEY,
    thread_id text NOT NULL,
    notice text NOT NULL
);
CREATE INDEX notices_thread ON notices (thread_id);

-- A2A push-notification configs: where a client asked to be told of its task's changes.
CREATE TABLE push_configs (
    thread_id text NOT NULL,
    id text NOT NULL,
    config text NOT NULL,
    PRIMARY KEY (thread_id, id)
);

-- The HTTP API: its tokens (only their SHA-256: a dump of the database gives nobody access)
-- and the request keys that make a retried request start one thread, not two.

CREATE TABLE api_tokens (
    name        text PRIMARY KEY,
    hash        text NOT NULL UNIQUE,
    read_only   boolean NOT NULL,
    created_ms  bigint NOT NULL
);

-- One row per claimed key: the primary key is what lets one request of many claim it.
CREATE TABLE request_keys (
    scope       text NOT NULL,
    key         text NOT NULL,
    fingerprint text NOT NULL,
    thread_id   text NOT NULL,
    created_ms  bigint NOT NULL,
    PRIMARY KEY (scope, key)
);

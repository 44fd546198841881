-- The OAuth credentials of MCP tool servers (`tools login`), one row per server URL: every
-- worker of every machine reads them, and the one that refreshes a token writes the new one
-- back. The value is the OAuth client's JSON (client id, tokens, scopes).
CREATE TABLE tool_credentials (
    url text PRIMARY KEY,
    credentials text NOT NULL,
    updated_ms bigint NOT NULL
);

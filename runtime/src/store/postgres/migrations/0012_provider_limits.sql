-- Provider limits shared by every worker of every machine: one row per named limit, holding
-- its last minute of calls, its waiting calls and when a provider closed it, as JSON. A
-- reservation locks the row (SELECT … FOR UPDATE) for the one transaction that decides it.
CREATE TABLE provider_limits (
    name text PRIMARY KEY,
    state text NOT NULL
);

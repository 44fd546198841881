-- Evals: one row per experiment, its definition (the version and bindings it runs, the
-- recorded threads and its own thread for each) as JSON. Its threads are rows of `threads`.
CREATE TABLE evals (
    id text PRIMARY KEY,
    experiment text NOT NULL
);

-- Evals: one row per experiment, its definition (the version and bindings it runs, the
-- recorded threads and its own thread for each) as JSON. Its threads are rows of `threads`.
CREATE TABLE evals (
    id text PRIMARY KEY,
    experiment text NOT NULL
);

-- Named sets of recorded threads (`eval set save`), as JSON.
CREATE TABLE eval_sets (
    name text PRIMARY KEY,
    set_json text NOT NULL
);

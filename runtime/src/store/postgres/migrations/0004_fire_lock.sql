-- The firing lock's generation. The lock itself is a transaction-scoped advisory lock, held
-- by an open transaction on a connection of its own (it goes with that connection, even
-- behind a transaction-pooling PgBouncer); whoever takes it counts the generation up, and
-- every write under the lock names the generation it holds, so a process that lost the lock
-- writes nothing.

CREATE TABLE fire_lock (
    only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    generation  bigint NOT NULL
);

INSERT INTO fire_lock (generation) VALUES (0);

-- A thread's records, calls and debug log no longer carry foreign keys to its row. Every
-- statement that writes them already holds that row: `append_records` updates it under the
-- thread's lease, the journal's inserts lock it `FOR SHARE`, the debug log's `FOR KEY SHARE`,
-- and a new thread's first rows go in with it. A foreign key checked it again, row by row (a
-- lookup and a lock per inserted line): about 50 µs of each step's ~200 µs in the database.
--
-- What the keys also did, removing a thread's rows with it, is now one statement per deleting
-- statement (a trigger over the deleted rows) rather than a cascade row by row: whatever
-- deletes threads (`thread rm`, `threads prune`, a process of an earlier version) leaves
-- nothing behind.

ALTER TABLE thread_records DROP CONSTRAINT thread_records_thread_fkey;
ALTER TABLE thread_calls DROP CONSTRAINT thread_calls_thread_fkey;
ALTER TABLE thread_log DROP CONSTRAINT thread_log_thread_fkey;

-- By an array of the deleted ids, not a join with the transition table: the planner knows
-- nothing of that table's size and joined it with a scan of each whole table (pruning 80,000
-- threads took 17 s instead of the cascade's 6-7 s; by index, as here, 6-7 s).
CREATE FUNCTION threads_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids text[] := ARRAY(SELECT id FROM gone);
BEGIN
    DELETE FROM uncaged_workflow.thread_records WHERE thread = ANY (ids);
    DELETE FROM uncaged_workflow.thread_calls WHERE thread = ANY (ids);
    DELETE FROM uncaged_workflow.thread_log WHERE thread = ANY (ids);
    RETURN NULL;
END
$$;

CREATE TRIGGER threads_deleted AFTER DELETE ON threads
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION threads_deleted();

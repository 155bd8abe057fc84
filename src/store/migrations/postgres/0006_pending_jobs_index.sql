-- claim_due and the counts of open jobs read only pending jobs, so only pending jobs are
-- indexed for them. The state index this replaces held every job ever finished too, about
-- three per order kept for retention, and claims slowed down as it grew: each lease or finish
-- leaves the job's old entry behind until vacuum, the finished version's entry went into the
-- leaf where the pending range begins, and a scan cannot mark dead entries on a leaf that
-- changed since it read it. So every claim re-read every dead entry since the last vacuum
-- (~9,500 per claim after four minutes at 1,100 orders/s without autovacuum). Here nothing is
-- added below the due jobs, and a claim's scan marks the dead entries it passes, so the next
-- one skips them.
--
-- Building it blocks writes to jobs until it is built. On a large table, build it first
-- without blocking, then start the new version (which finds it, and drops the old index):
--   CREATE INDEX CONCURRENTLY jobs_due ON jobs (run_at_ms, id) WHERE state = 'pending';
-- (if that fails it leaves an INVALID index: DROP INDEX CONCURRENTLY jobs_due, and again).
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (run_at_ms, id) WHERE state = 'pending';
DROP INDEX jobs_state_run_at_id;

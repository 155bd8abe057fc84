-- claim_due and the counts of open jobs read only pending jobs, so only pending jobs are
-- indexed for them. The state index this replaces held every job ever finished too (about
-- three per order, kept for retention): each finished job was one more entry written there,
-- at the edge of the done range, in the same pages the next claim began reading.
-- (The index ends with the rowid, which is the id: claim_due's order needs nothing more.)
CREATE INDEX jobs_due ON jobs (run_at_ms) WHERE state = 'pending';
DROP INDEX jobs_state_run_at;

-- claim_due and the counts of open jobs read only pending jobs, so only pending jobs are
-- indexed for them. The state index this replaces also held every finished job, about three
-- per order kept for retention: one more index entry written per finished job, and ~66 bytes
-- per order on disk. (The index ends with the rowid, which is the id: claim_due's order needs
-- nothing more.)
CREATE INDEX jobs_due ON jobs (run_at_ms) WHERE state = 'pending';
DROP INDEX jobs_state_run_at;

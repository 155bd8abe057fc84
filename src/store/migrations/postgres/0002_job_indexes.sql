-- Reading an order lists the kinds of its parked jobs. Without this index the planner may
-- walk every parked job (through the state index) on each read, and parked jobs accumulate
-- until an operator acts. Only parked jobs are indexed, so other jobs pay nothing for it.
CREATE INDEX jobs_parked ON jobs (order_id) WHERE state = 'parked';

-- claim_due takes pending jobs in (run_at_ms, id) order. With id in the index the scan
-- stops after the jobs it leases, instead of sorting every due job when there is a backlog.
-- It still serves the per-state counts of stats.
CREATE INDEX jobs_state_run_at_id ON jobs (state, run_at_ms, id);
DROP INDEX jobs_state_run_at;

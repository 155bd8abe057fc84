-- Reading an order lists the kinds of its parked jobs. Without this index SQLite walks every
-- parked job (through the state index) on each read, and parked jobs accumulate until an
-- operator acts. Only parked jobs are indexed, so other jobs pay nothing for it.
-- (claim_due needs no new index here: the state index ends with the rowid, which is the id.)
CREATE INDEX jobs_parked ON jobs (order_id) WHERE state = 'parked';

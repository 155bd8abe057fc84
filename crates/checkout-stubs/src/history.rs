//! Bounded memory for what the stubs keep of past calls (so a long run stays flat): a [`Ring`] for the effect
//! log, and [`Records`] for data kept per order reference, whose entries are evicted oldest first
//! once they are final. Both are allocated when created at the size a long run needs, so a long
//! run neither grows them nor reallocates a large table under the state lock, and both count
//! what they let go. Every operation is O(1).

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroUsize;
use std::sync::Arc;

/// What a bounded collection holds now and what it has let go since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Entries kept now.
    pub(crate) kept: usize,
    /// Entries dropped or evicted to stay within the capacity. `kept + gone` is every entry ever
    /// added.
    pub(crate) gone: u64,
}

/// The most recent `capacity` entries, oldest first; pushing onto a full ring drops the oldest.
#[derive(Debug)]
pub(crate) struct Ring<T> {
    entries: VecDeque<T>,
    capacity: usize,
    /// Entries dropped from the front to make room.
    dropped: u64,
}

impl<T> Ring<T> {
    /// An empty ring with room for `capacity` entries, allocated now.
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        Self {
            entries: VecDeque::with_capacity(capacity.get()),
            capacity: capacity.get(),
            dropped: 0,
        }
    }

    /// Appends `entry`, dropping the oldest entry first if the ring is full.
    pub(crate) fn push(&mut self, entry: T) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back(entry);
    }

    /// The entries kept, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.entries.iter()
    }

    /// Entries kept and dropped.
    pub(crate) fn tally(&self) -> Tally {
        Tally {
            kept: self.entries.len(),
            gone: self.dropped,
        }
    }
}

/// One value kept for a reference, and whether it is final (and so may be evicted).
#[derive(Debug)]
struct Kept<V> {
    value: V,
    finished: bool,
}

/// Values by order reference. A value is either live — still needed for lookups and duplicate
/// detection, and never evicted — or finished: once more than `capacity` values are finished,
/// the one that finished first is evicted, and its reference is forgotten as if never seen.
/// At most `capacity` finished values are kept, plus every live one.
#[derive(Debug)]
pub(crate) struct Records<V> {
    by_reference: HashMap<Arc<str>, Kept<V>>,
    /// References of the finished values, in the order they finished: the eviction order.
    finished: VecDeque<Arc<str>>,
    capacity: usize,
    /// Finished values evicted to stay within the capacity.
    evicted: u64,
}

impl<V> Records<V> {
    /// No records, with their table and eviction queue allocated now at the size a long run
    /// needs, so neither grows as values are evicted (the table can still grow once if the
    /// live values, never evicted, fill what half of its room leaves beside `capacity`).
    ///
    /// The table gets room for twice `capacity`: a hash table that evicts one entry for every
    /// one it inserts leaves tombstones, and once they use up its spare room it grows — a table
    /// more than half full doubles rather than rehashing in place. Sized for `capacity` alone, it
    /// doubled after about half as many evictions as its capacity (with 50,000 kept, 7.8 →
    /// 15.6 MB at the 74,321st insert: the second minute of a 1,100/s soak, when the stubs' RSS
    /// rose); at most half full, it rehashes in place instead. The queue holds one more than
    /// `capacity`, because a newly finished reference is queued before the oldest leaves.
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        Self {
            by_reference: HashMap::with_capacity(capacity.get().saturating_mul(2)),
            finished: VecDeque::with_capacity(capacity.get().saturating_add(1)),
            capacity: capacity.get(),
            evicted: 0,
        }
    }

    /// The value kept for `reference`.
    pub(crate) fn get(&self, reference: &str) -> Option<&V> {
        self.by_reference.get(reference).map(|kept| &kept.value)
    }

    /// The value kept for `reference`, to change in place.
    pub(crate) fn get_mut(&mut self, reference: &str) -> Option<&mut V> {
        self.by_reference
            .get_mut(reference)
            .map(|kept| &mut kept.value)
    }

    /// Keeps `value` for `reference` until [`Records::finish`] is called for it. Callers look the
    /// reference up first: a reference already kept keeps its value and this changes nothing.
    pub(crate) fn insert_live(&mut self, reference: &str, value: V) {
        self.insert(reference, value, false);
    }

    /// Keeps `value` for `reference` as already final, so it is evicted in turn. Like
    /// [`Records::insert_live`], it never replaces a value already kept.
    pub(crate) fn insert_finished(&mut self, reference: &str, value: V) {
        self.insert(reference, value, true);
    }

    /// Marks the value for `reference` final: from now on it is evicted in turn. Finishing an
    /// unknown or already finished reference changes nothing.
    pub(crate) fn finish(&mut self, reference: &str) {
        let Some((key, kept)) = self.by_reference.get_key_value(reference) else {
            return;
        };
        if kept.finished {
            return;
        }
        let key = Arc::clone(key);
        if let Some(kept) = self.by_reference.get_mut(reference) {
            kept.finished = true;
        }
        self.queue_for_eviction(key);
    }

    /// Values kept (live and finished) and finished values evicted.
    pub(crate) fn tally(&self) -> Tally {
        Tally {
            kept: self.by_reference.len(),
            gone: self.evicted,
        }
    }

    fn insert(&mut self, reference: &str, value: V, finished: bool) {
        let already_kept = self.by_reference.contains_key(reference);
        debug_assert!(
            !already_kept,
            "{reference:?} is already kept; callers look it up first"
        );
        if already_kept {
            return;
        }
        let key: Arc<str> = Arc::from(reference);
        self.by_reference
            .insert(Arc::clone(&key), Kept { value, finished });
        if finished {
            self.queue_for_eviction(key);
        }
    }

    /// Appends a newly finished reference and evicts the oldest finished value past capacity.
    fn queue_for_eviction(&mut self, key: Arc<str>) {
        self.finished.push_back(key);
        if self.finished.len() > self.capacity
            && let Some(oldest) = self.finished.pop_front()
        {
            self.by_reference.remove(&oldest);
            self.evicted += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    #[test]
    fn a_full_ring_drops_its_oldest_entry_and_counts_it() {
        let mut ring = Ring::new(capacity(3));
        for n in 1..=5 {
            ring.push(n);
        }
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!(ring.tally(), Tally { kept: 3, gone: 2 });
    }

    #[test]
    fn finished_records_are_evicted_oldest_first_past_capacity() {
        let mut records = Records::new(capacity(2));
        for reference in ["a", "b", "c"] {
            records.insert_live(reference, reference.to_uppercase());
        }
        records.finish("b");
        records.finish("a");
        records.finish("c");
        // Finished in the order b, a, c: b went first.
        assert_eq!(records.get("b"), None);
        assert_eq!(records.get("a").map(String::as_str), Some("A"));
        assert_eq!(records.get("c").map(String::as_str), Some("C"));
        assert_eq!(records.tally(), Tally { kept: 2, gone: 1 });
    }

    #[test]
    fn live_records_are_never_evicted_however_many_finish() {
        let mut records = Records::new(capacity(1));
        records.insert_live("live", 0);
        for n in 0..10 {
            records.insert_finished(&format!("done-{n}"), n);
        }
        assert_eq!(records.get("live"), Some(&0));
        assert_eq!(records.get("done-9"), Some(&9));
        assert_eq!(records.get("done-8"), None);
        assert_eq!(records.tally(), Tally { kept: 2, gone: 9 });
    }

    #[test]
    fn a_long_run_of_evictions_never_grows_the_table_or_the_queue() {
        const CAPACITY: usize = 5_000;
        let mut records = Records::new(capacity(CAPACITY));
        let table = records.by_reference.capacity();
        let queue = records.finished.capacity();
        // Twenty times the capacity inserted and evicted, as a soak does: the tombstones the
        // evictions leave must be rehashed in place, never make the table grow.
        for n in 0..20 * CAPACITY {
            records.insert_finished(&format!("order-{n}"), n);
            assert!(
                records.by_reference.capacity() <= table,
                "the table grew after {n} inserts: {} > {table}",
                records.by_reference.capacity()
            );
        }
        assert_eq!(records.finished.capacity(), queue);
        assert_eq!(
            records.tally(),
            Tally {
                kept: CAPACITY,
                gone: 19 * CAPACITY as u64
            }
        );
    }

    #[test]
    fn finishing_twice_or_an_unknown_reference_queues_nothing_more() {
        let mut records = Records::new(capacity(2));
        records.insert_live("a", ());
        records.insert_finished("b", ());
        records.finish("a");
        records.finish("a");
        records.finish("b");
        records.finish("nope");
        assert_eq!(records.tally(), Tally { kept: 2, gone: 0 });
    }
}

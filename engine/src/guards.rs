//! [`Guards`]: the reclaimers one call pins for its whole run, and the small maps that share
//! one of them ([`SmallMaps`]: the tombstones and the reposts waiting for their source).

use crossbeam_epoch::Guard;
use std::sync::Arc;

type IdHasher = foldhash::fast::RandomState;

/// A small concurrent map keyed by post id (papaya), built by [`SmallMaps::map`].
pub(crate) type IdMap<V> = papaya::HashMap<i64, V, IdHasher>;

/// Retired entries of the small maps a thread gathers before it tries to reclaim them
/// (seize's batch size; its default is 32). Each attempt issues a `membarrier` system call,
/// which interrupts every other core running a thread of the process; with the default, the
/// tombstone updates of a delete-heavy load made one every 32 deletes, 2.7% of two writers'
/// samples at scale 10. A batch holds at most this many small entries (or a replaced table)
/// per thread a little longer.
const RETIRE_BATCH: usize = 1024;

/// The one collector of the small maps, so that one guard covers them all.
pub(crate) struct SmallMaps {
    collector: Arc<seize::Collector>,
}

impl SmallMaps {
    pub(crate) fn new() -> Self {
        Self {
            collector: Arc::new(seize::Collector::new().batch_size(RETIRE_BATCH)),
        }
    }

    /// An empty map on this collector.
    pub(crate) fn map<V: Send + 'static>(&self) -> IdMap<V> {
        papaya::HashMap::builder()
            .hasher(IdHasher::default())
            .shared_collector(Arc::clone(&self.collector))
            .build()
    }
}

/// The guards one call (a query, or an insert, delete or trim of a batch) holds while it runs,
/// and the time it runs at.
pub(crate) struct Guards<'s> {
    /// The store clock when the call began.
    pub(crate) now: i64,
    /// The epoch pin that keeps records, rings and index tables read meanwhile alive.
    pub(crate) epoch: Guard,
    /// The small maps' guard (any map of one [`SmallMaps`] takes it).
    pub(crate) maps: papaya::LocalGuard<'s>,
}

impl<'s> Guards<'s> {
    /// Pins both reclaimers at `now`, `map` giving the small maps' guard. The epoch is pinned
    /// first.
    pub(crate) fn pin<V>(now: i64, map: &'s IdMap<V>) -> Self {
        let epoch = crossbeam_epoch::pin();
        Self {
            now,
            epoch,
            maps: map.guard(),
        }
    }
}

//! [`ShardId`]: which author shard of a fleet a store is. A shard keeps its own authors'
//! posts and, in its fact directory (`directory.rs`), the few facts of the others' posts the
//! query rules read; snapshots record the shard, so a shard loads only its own.

/// Which shard of an author-sharded fleet a store is: shard `index` of `count`. Recorded in
/// snapshots, so a shard never loads another shard's (or a full store's) snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShardId {
    /// This shard, `0 ..count`.
    pub index: u32,
    /// Number of shards, at least 1.
    pub count: u32,
}

impl std::fmt::Display for ShardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

//! The operation language of the store fuzzers.
//!
//! Raw values are small integers that are mapped into narrow ranges when an operation is
//! applied: the fuzzer explores combinations of a few ids rather than the `i64` space, so the
//! same post is created twice, deleted before it exists, reposted, replied to and evicted.

use arbitrary::Arbitrary;
use thunder_engine::{DeleteEvent, LightPost, OwnedQuery};

/// Unix time the clock starts at.
pub const START_SECS: i64 = 1_700_000_000;
/// Post ids are `-2 ..= POST_IDS - 3`: includes 0 and negative ids.
pub const POST_IDS: i64 = 24;
/// Author (user) ids are `-1 ..= AUTHORS - 2`: includes 0 and a negative id.
pub const AUTHORS: i64 = 6;
/// Most operations taken from one input (the rest is ignored to keep executions fast).
pub const MAX_OPS: usize = 64;
/// Most posts in one create batch and most events in one delete batch.
pub const MAX_BATCH: usize = 8;

/// A post id from a raw value.
pub fn post_id(raw: u8) -> i64 {
    i64::from(raw) % POST_IDS - 2
}

/// An author or user id from a raw value.
pub fn user_id(raw: u8) -> i64 {
    i64::from(raw) % AUTHORS - 1
}

/// The size of the store under test.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct Setup {
    /// Retention: `20 + retention % 100` seconds.
    pub retention: u8,
    /// Timeline cap (`max_posting_list_size`): `1 + cap % 8`.
    pub cap: u8,
}

impl Setup {
    /// The retention window in seconds.
    pub fn retention_secs(&self) -> i64 {
        20 + i64::from(self.retention % 100)
    }

    /// The timeline cap.
    pub fn max_posting_list_size(&self) -> usize {
        1 + usize::from(self.cap % 8)
    }
}

/// A creation or deletion time, relative to the clock when the operation runs.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum When {
    /// `now + 3 - v % (retention + 6)`: from a little in the future to just past retention.
    /// Equal raw values give equal timestamps (ties); unequal ones arrive out of order.
    Recent(u8),
    /// One of the edges: future, exactly at or one past retention, outside `0 ..= u32::MAX`.
    Edge(u8),
}

impl When {
    /// The unix time this stands for at `now`.
    pub fn resolve(self, now: i64, retention_secs: i64) -> i64 {
        match self {
            When::Recent(v) => now + 3 - i64::from(v) % (retention_secs + 6),
            When::Edge(v) => match v % 10 {
                0 => now,
                1 => now + 1,
                2 => now - retention_secs,
                3 => now - retention_secs - 1,
                4 => now + 3600,
                5 => -1,
                6 => 0,
                7 => i64::from(u32::MAX) + 1,
                8 => i64::MIN,
                _ => i64::MAX,
            },
        }
    }
}

/// A post to create. Flags are bits of `kind`: 1 reply, 2 repost, 4 video.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct PostSpec {
    /// Raw post id.
    pub post_id: u8,
    /// Raw author id.
    pub author_id: u8,
    /// Creation time.
    pub created: When,
    /// Flag bits.
    pub kind: u8,
    /// Raw parent post id.
    pub in_reply_to_post_id: Option<u8>,
    /// Raw parent author id.
    pub in_reply_to_user_id: Option<u8>,
    /// Raw reposted post id.
    pub source_post_id: Option<u8>,
    /// Raw reposted post's author id.
    pub source_user_id: Option<u8>,
    /// Raw conversation (root post) id.
    pub conversation_id: Option<u8>,
}

/// Who may write which ids: the writer threads of `ingest_ordering_threads` each own the post
/// and author ids of one parity, so their operations commute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// One writer: every id.
    All,
    /// Writer `0` or `1`: post ids, author ids and repost sources of that parity.
    Parity(i64),
}

impl Ownership {
    /// `id`, moved to the nearest owned id.
    pub fn own(self, id: i64) -> i64 {
        match self {
            Ownership::All => id,
            Ownership::Parity(p) if id.rem_euclid(2) == p => id,
            Ownership::Parity(_) => id + 1,
        }
    }
}

impl PostSpec {
    /// The post this spec stands for at `now`. Under [`Ownership::Parity`] the post id, the
    /// author and the repost source are owned ids (the source decides video eligibility at
    /// insert time, so it must not be written concurrently by the other writer); reply parents
    /// and user ids are only read by queries and stay free.
    pub fn build(&self, now: i64, retention_secs: i64, owner: Ownership) -> LightPost {
        LightPost {
            post_id: owner.own(post_id(self.post_id)),
            author_id: owner.own(user_id(self.author_id)),
            created_at: self.created.resolve(now, retention_secs),
            in_reply_to_post_id: self.in_reply_to_post_id.map(post_id),
            in_reply_to_user_id: self.in_reply_to_user_id.map(user_id),
            is_reply: self.kind & 1 != 0,
            is_retweet: self.kind & 2 != 0,
            has_video: self.kind & 4 != 0,
            source_post_id: self.source_post_id.map(|s| owner.own(post_id(s))),
            source_user_id: self.source_user_id.map(user_id),
            conversation_id: self.conversation_id.map(post_id),
        }
    }
}

/// A delete of one post.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct DeleteSpec {
    /// Raw post id.
    pub post_id: u8,
    /// Time of the delete (the producer's clock; may be in the future or long ago).
    pub deleted_at: When,
}

impl DeleteSpec {
    /// The delete event this spec stands for at `now`.
    pub fn build(&self, now: i64, retention_secs: i64, owner: Ownership) -> DeleteEvent {
        DeleteEvent {
            post_id: owner.own(post_id(self.post_id)),
            deleted_at: self.deleted_at.resolve(now, retention_secs),
        }
    }
}

/// A move of the shared clock.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Advance {
    /// A few seconds forward: `v % 16`.
    Tick(u8),
    /// Up to about twice the retention forward: `v * retention / 128`.
    Far(u8),
    /// A few seconds back: `-(1 + v % 8)`.
    Back(u8),
}

impl Advance {
    /// Seconds to add to the clock.
    pub fn secs(self, retention_secs: i64) -> i64 {
        match self {
            Advance::Tick(v) => i64::from(v % 16),
            Advance::Far(v) => i64::from(v) * retention_secs / 128,
            Advance::Back(v) => -(1 + i64::from(v % 8)),
        }
    }
}

/// A query.
#[derive(Arbitrary, Clone, Debug)]
pub struct QuerySpec {
    /// `get_videos_by_users` instead of `get_all_posts_by_users`.
    pub videos: bool,
    /// Raw viewer id.
    pub viewer_id: u8,
    /// Raw author ids (repeats allowed).
    pub authors: Vec<u8>,
    /// Raw excluded post ids.
    pub exclude: Vec<u8>,
    /// `max_results`: `v % 16`, or 1200 for `v >= 240`.
    pub max_results: u8,
    /// `max_originals_per_author`: `v % 64` (values above 50 are clamped by the store).
    pub max_originals_per_author: u8,
    /// `max_secondary_per_author`: `v % 40` (values above 30 are clamped by the store).
    pub max_secondary_per_author: u8,
    /// Run with a deadline that has already passed (only the invariants are checked then).
    pub deadline_passed: bool,
}

impl QuerySpec {
    /// The query this spec stands for (a passed deadline is the moment it is built).
    pub fn build(&self) -> OwnedQuery {
        let authors = self.authors.iter().take(12).copied().map(user_id).collect();
        OwnedQuery {
            exclude: self.exclude.iter().take(12).copied().map(post_id).collect(),
            max_results: if self.max_results >= 240 {
                1200
            } else {
                usize::from(self.max_results % 16)
            },
            max_originals_per_author: usize::from(self.max_originals_per_author % 64),
            max_secondary_per_author: usize::from(self.max_secondary_per_author % 40),
            deadline: self.deadline_passed.then(std::time::Instant::now),
            ..OwnedQuery::new(self.videos, user_id(self.viewer_id), authors)
        }
    }
}

/// Every author, generous limits, a viewer nobody reposts: run after every step so a
/// divergence shows at the step that causes it.
pub fn audit_query(videos: bool) -> OwnedQuery {
    OwnedQuery {
        max_results: 1200,
        max_originals_per_author: 50,
        max_secondary_per_author: 30,
        ..OwnedQuery::new(videos, 1_000_000, (-1..=AUTHORS).collect())
    }
}

/// One step of the sequential target.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    /// Insert a batch of new posts.
    Create(Vec<PostSpec>),
    /// Re-send a post offered earlier (`pick` indexes the history), at its own time or another.
    Duplicate {
        /// Which earlier post.
        pick: u8,
        /// A new creation time, or the original one.
        created: Option<When>,
    },
    /// Delete a batch of posts.
    Delete(Vec<DeleteSpec>),
    /// Move the clock.
    Advance(Advance),
    /// Trim shard `shard % TRIM_FRACTION`.
    Trim(u8),
    /// Query both stores and compare.
    Query(QuerySpec),
    /// Write the engine as a base file and go on with a fresh engine loaded from it: what
    /// came before is in its base, what comes after in its head.
    Rebase,
}

/// Input of `ingest_ordering`.
#[derive(Arbitrary, Clone, Debug)]
pub struct Sequence {
    /// Store size.
    pub setup: Setup,
    /// The steps, in order (at most [`MAX_OPS`] are used).
    pub ops: Vec<Op>,
}

/// A write by one of the two writer threads.
#[derive(Arbitrary, Clone, Debug)]
pub enum WriterOp {
    /// Insert a batch of new posts (ids mapped to the writer's parity).
    Create(Vec<PostSpec>),
    /// Delete a batch of posts (ids mapped to the writer's parity).
    Delete(Vec<DeleteSpec>),
}

/// A single-threaded step between two concurrent rounds.
#[derive(Arbitrary, Clone, Debug)]
pub enum BetweenOp {
    /// Move the clock.
    Advance(Advance),
    /// Trim shard `shard % TRIM_FRACTION`.
    Trim(u8),
    /// Query both stores and compare.
    Query(QuerySpec),
}

/// One barrier-separated round of `ingest_ordering_threads`.
#[derive(Arbitrary, Clone, Debug)]
pub struct Round {
    /// Writes of writer 0 (even ids) and writer 1 (odd ids), run concurrently.
    pub writers: [Vec<WriterOp>; 2],
    /// Queries run on the engine while the writers run (invariants only).
    pub concurrent_reads: Vec<QuerySpec>,
    /// Steps after the round, applied to both stores.
    pub between: Vec<BetweenOp>,
}

/// Input of `ingest_ordering_threads`.
#[derive(Arbitrary, Clone, Debug)]
pub struct Rounds {
    /// Store size.
    pub setup: Setup,
    /// The rounds, in order (at most [`MAX_OPS`] / 4 are used).
    pub rounds: Vec<Round>,
}

//! Deterministic synthetic "feed-2d" workload: authors, posts, deletes and viewers.
//!
//! The workload of the project's benchmark, generated from a seed so that the engine, the
//! baseline, the demo server, the producer and the tests all see the same stream. A crate of its
//! own so that the server's demo and `thunder-cli produce` link the generator alone, not the
//! model store and test helpers of thunder-testkit:
//!
//! - `1_000_000 / scale` authors and `20_000_000 / scale` posts spread over a window (two days)
//!   ending at `now_secs`;
//! - author activity ∝ 1/(rank + 500) (Zipf–Mandelbrot), so the busiest authors reach the
//!   5000-entry timeline cap and the median author posts a handful of times;
//! - about 60% originals, 25% replies, 15% reposts; about 8% of originals carry video;
//! - reposts point at recent posts (a share of them at video originals), replies at recent posts
//!   (mostly originals, some replies) and carry the conversation root and the parent's author;
//! - posts arrive mostly in `created_at` order with a few seconds of jitter and a small share of
//!   late arrivals; about 1% of posts are deleted later, a small share of those deletes arriving
//!   before their create;
//! - viewers follow 2000 authors drawn ∝ 1/(rank + 100), 10% of them follow 10000.
//!
//! # Usage
//! ```
//! use thunder_workload::SynthConfig;
//! use thunder_engine::PostEvent;
//! let config = SynthConfig::feed_2d(1000, 1_700_000_000);
//! let creates = config.backlog().filter(|e| matches!(e, PostEvent::Create(_))).count();
//! assert_eq!(creates as u64, config.posts);
//! let viewer = config.viewer(0);
//! assert!(!viewer.following.is_empty());
//! ```
//!
//! # Determinism and cost
//! Every attribute of post `i` (author, kind, video, reply/repost target, delete) is a pure
//! function of `(seed, i)`: a counter-based hash, no shared random state. The backlog is a
//! streaming iterator (a per-second reorder buffer holds only the events not yet due), so
//! 20M events take a few seconds and little memory. [`LiveSource`] continues the same sequence
//! after the backlog, stamped at the caller's clock.

#![deny(missing_docs)]

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BinaryHeap, VecDeque};

use thunder_engine::{DeleteEvent, LightPost, PostEvent};

/// Authors at scale 1.
pub const FEED_2D_AUTHORS: u64 = 1_000_000;
/// Posts in the window at scale 1.
pub const FEED_2D_POSTS: u64 = 20_000_000;
/// Scale of the server's demo workload unless `--demo-scale` says otherwise: 10 000 authors and
/// 200 000 posts, loaded in well under a second.
pub const DEMO_SCALE: u32 = 100;
/// Default seed of [`SynthConfig::feed_2d`].
pub const DEFAULT_SEED: u64 = 0x0074_6875_6e64_6572;
/// First author id; author ids are `AUTHOR_ID_BASE + permutation(rank)`.
pub const AUTHOR_ID_BASE: i64 = 1_000_000;
/// First post id; post `i` of the sequence has id `POST_ID_BASE + i`.
pub const POST_ID_BASE: i64 = 1_000_000_000_000;
/// Length of the exclude list built by [`exclude_from_answer`].
pub const EXCLUDE_LIST_LEN: usize = 500;
/// The first posts of the sequence are all originals, so reply and repost targets always exist.
const HISTORY_ORIGINALS: u64 = 64;
/// Longest walk when looking for a target of a given kind before falling back.
const MAX_TARGET_WALK: u64 = 256;

/// Parameters of the workload. Build with [`SynthConfig::feed_2d`], then adjust fields.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthConfig {
    /// Seed; equal configs generate equal streams.
    pub seed: u64,
    /// Divisor applied to the full-size author and post counts (1 = full scale).
    pub scale: u32,
    /// End of the window: the newest backlog post is created at this time (unix seconds).
    pub now_secs: i64,
    /// Length of the window the backlog is spread over; posts are created in
    /// `(now_secs - window_secs, now_secs]`.
    pub window_secs: i64,
    /// Number of authors.
    pub authors: u64,
    /// Number of posts in the backlog.
    pub posts: u64,
    /// Zipf–Mandelbrot offset `q` of author activity, weight ∝ 1/(rank + q).
    pub activity_offset: f64,
    /// Zipf–Mandelbrot offset of follow popularity, weight ∝ 1/(rank + q).
    pub follow_offset: f64,
    /// Share of replies among posts.
    pub reply_ratio: f64,
    /// Share of reposts among posts.
    pub repost_ratio: f64,
    /// Share of originals (and replies) carrying video.
    pub video_ratio: f64,
    /// Share of reposts whose source is a video original.
    pub repost_video_ratio: f64,
    /// Share of replies answering another reply (the rest answer originals).
    pub reply_to_reply_ratio: f64,
    /// How far back (seconds of posting) reply and repost targets reach.
    pub recent_target_secs: i64,
    /// Share of posts deleted later.
    pub delete_ratio: f64,
    /// Share of deletes that arrive before their create.
    pub delete_before_create_ratio: f64,
    /// Mean delay between a post and its delete, seconds.
    pub delete_mean_delay_secs: f64,
    /// Arrival jitter: a post arrives up to this many seconds after its `created_at`.
    pub jitter_secs: i64,
    /// Share of posts that arrive late.
    pub late_ratio: f64,
    /// Range of the delay of late arrivals, seconds.
    pub late_delay_secs: (i64, i64),
    /// Follow count of an ordinary viewer.
    pub follows: usize,
    /// Follow count of a heavy viewer.
    pub heavy_follows: usize,
    /// Share of heavy viewers.
    pub heavy_viewer_ratio: f64,
}

impl SynthConfig {
    /// The "feed-2d" workload divided by `scale` (1 = 1M authors, 20M posts), ending at `now_secs`.
    pub fn feed_2d(scale: u32, now_secs: i64) -> Self {
        let scale = scale.max(1);
        Self {
            seed: DEFAULT_SEED,
            scale,
            now_secs,
            window_secs: 2 * 24 * 60 * 60,
            authors: (FEED_2D_AUTHORS / u64::from(scale)).max(1),
            posts: FEED_2D_POSTS / u64::from(scale),
            activity_offset: 500.0,
            follow_offset: 100.0,
            reply_ratio: 0.25,
            repost_ratio: 0.15,
            video_ratio: 0.08,
            repost_video_ratio: 0.25,
            reply_to_reply_ratio: 0.2,
            recent_target_secs: 30 * 60,
            delete_ratio: 0.01,
            delete_before_create_ratio: 0.05,
            delete_mean_delay_secs: 3600.0,
            jitter_secs: 3,
            late_ratio: 0.005,
            late_delay_secs: (60, 900),
            follows: 2000,
            heavy_follows: 10_000,
            heavy_viewer_ratio: 0.1,
        }
    }

    /// The same config with another seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Streaming iterator over the backlog events in arrival order.
    pub fn backlog(&self) -> Backlog {
        Backlog::new(self)
    }

    /// All backlog events in arrival order, materialised (about 100 bytes per event).
    pub fn backlog_vec(&self) -> Vec<PostEvent> {
        let mut events =
            Vec::with_capacity((self.posts as f64 * (1.0 + self.delete_ratio)) as usize + 16);
        events.extend(self.backlog());
        events
    }

    /// A source of new events after the backlog, stamped at the caller's clock.
    pub fn live(&self) -> LiveSource {
        LiveSource::new(self)
    }

    /// Post `index` of the sequence, with its backlog `created_at`.
    pub fn post(&self, index: u64) -> LightPost {
        let model = Model::new(self);
        let mut post = model.post(index);
        post.created_at = model.created_at(index);
        post
    }

    /// Author id of the author with activity rank `rank` (0 = most active), `rank < authors`.
    pub fn author_id(&self, rank: u64) -> i64 {
        Model::new(self).author_id(rank)
    }

    /// Viewer `index`: its user id and follow list, a pure function of `(seed, index)`.
    pub fn viewer(&self, index: u64) -> Viewer {
        Model::new(self).viewer(index)
    }

    /// Viewers `0..count`.
    pub fn viewers(&self, count: usize) -> Vec<Viewer> {
        let model = Model::new(self);
        (0..count as u64).map(|i| model.viewer(i)).collect()
    }
}

/// A user who reads the feed: who they are and whom they follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Viewer {
    /// The viewer's own user id (an author id; their reposted posts are filtered for them).
    pub user_id: i64,
    /// Followed author ids, distinct, most popular drawn first.
    pub following: Vec<i64>,
}

/// Up to [`EXCLUDE_LIST_LEN`] post ids of `previous_answer`, sampled deterministically from the
/// viewer's id: the posts a client has already seen and asks not to get again.
pub fn exclude_from_answer(
    viewer: &Viewer,
    previous_answer: impl IntoIterator<Item = i64>,
) -> Vec<i64> {
    let mut ids: Vec<i64> = previous_answer.into_iter().collect();
    if ids.len() <= EXCLUDE_LIST_LEN {
        return ids;
    }
    let mut rng = SmallRng::seed_from_u64(mix(viewer.user_id as u64, 0xe8c1_0d5e));
    for k in 0..EXCLUDE_LIST_LEN {
        let j = rng.random_range(k..ids.len());
        ids.swap(k, j);
    }
    ids.truncate(EXCLUDE_LIST_LEN);
    ids
}

/// Hash streams: one independent random value per (post, attribute).
mod stream {
    pub const AUTHOR: u64 = 1;
    pub const KIND: u64 = 2;
    pub const VIDEO: u64 = 3;
    pub const TARGET_KIND: u64 = 4;
    pub const TARGET_DISTANCE: u64 = 5;
    pub const DELETE: u64 = 6;
    pub const DELETE_DELAY: u64 = 7;
    pub const ARRIVAL: u64 = 8;
    pub const LATE: u64 = 9;
    pub const VIEWER: u64 = 10;
}

/// splitmix64 finaliser of `a` combined with `b`.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in `[0, 1)` from 53 bits of `x`.
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Original,
    Reply,
    Repost,
}

/// Derived constants of a config; every per-post attribute is computed from here.
#[derive(Clone, Debug)]
struct Model {
    config: SynthConfig,
    key: u64,
    activity_log_span: f64,
    follow_log_span: f64,
    author_mul: u64,
    author_add: u64,
    recent_posts: u64,
    window_start: i64,
    window_len: i64,
}

impl Model {
    fn new(config: &SynthConfig) -> Self {
        let n = config.authors.max(1);
        let mut author_mul = 0x9e37_79b1 % n;
        while gcd(author_mul.max(1), n) != 1 {
            author_mul += 1;
        }
        let window_len = config.window_secs.max(1);
        let per_sec = config.posts as f64 / window_len as f64;
        Self {
            key: mix(config.seed, 0x5eed),
            activity_log_span: ((n as f64 + config.activity_offset) / config.activity_offset).ln(),
            follow_log_span: ((n as f64 + config.follow_offset) / config.follow_offset).ln(),
            author_mul: author_mul.max(1),
            author_add: mix(config.seed, 0xadd) % n,
            recent_posts: ((per_sec * config.recent_target_secs as f64) as u64).max(16),
            window_start: config.now_secs - window_len + 1,
            window_len,
            config: config.clone(),
        }
    }

    #[inline]
    fn rnd(&self, index: u64, stream: u64) -> u64 {
        mix(self.key ^ index.wrapping_mul(0xd6e8_feb8_6659_fd93), stream)
    }

    #[inline]
    fn unit(&self, index: u64, stream: u64) -> f64 {
        unit(self.rnd(index, stream))
    }

    /// Zipf–Mandelbrot rank by inverting the continuous CDF of 1/(x + q) on [0, n).
    #[inline]
    fn zipf_rank(u: f64, offset: f64, log_span: f64, n: u64) -> u64 {
        let x = offset * (u * log_span).exp() - offset;
        (x as u64).min(n - 1)
    }

    #[inline]
    fn author_id(&self, rank: u64) -> i64 {
        let n = self.config.authors.max(1);
        let permuted = ((u128::from(rank) * u128::from(self.author_mul)
            + u128::from(self.author_add))
            % u128::from(n)) as u64;
        AUTHOR_ID_BASE + permuted as i64
    }

    #[inline]
    fn author_of(&self, index: u64) -> i64 {
        let u = self.unit(index, stream::AUTHOR);
        self.author_id(Self::zipf_rank(
            u,
            self.config.activity_offset,
            self.activity_log_span,
            self.config.authors.max(1),
        ))
    }

    #[inline]
    fn kind(&self, index: u64) -> Kind {
        if index < HISTORY_ORIGINALS {
            return Kind::Original;
        }
        let u = self.unit(index, stream::KIND);
        if u < self.config.reply_ratio {
            Kind::Reply
        } else if u < self.config.reply_ratio + self.config.repost_ratio {
            Kind::Repost
        } else {
            Kind::Original
        }
    }

    #[inline]
    fn has_video(&self, index: u64) -> bool {
        self.kind(index) != Kind::Repost
            && self.unit(index, stream::VIDEO) < self.config.video_ratio
    }

    /// Where a target search of post `index` starts: a recent earlier post, skewed to the newest.
    fn target_start(&self, index: u64) -> u64 {
        let u = self.unit(index, stream::TARGET_DISTANCE);
        let distance = 1 + (u * u * self.recent_posts as f64) as u64;
        index.saturating_sub(distance)
    }

    /// The newest post at or before `start` matching `wanted`, within the walk limit.
    fn walk_back(&self, start: u64, wanted: impl Fn(u64) -> bool) -> Option<u64> {
        let lowest = start.saturating_sub(MAX_TARGET_WALK);
        let mut j = start;
        loop {
            if wanted(j) {
                return Some(j);
            }
            if j == lowest {
                return None;
            }
            j -= 1;
        }
    }

    /// The nearest original at or before `start` (always exists: the first posts are originals).
    fn original_at_or_before(&self, start: u64) -> u64 {
        let mut j = start;
        while self.kind(j) != Kind::Original {
            j -= 1;
        }
        j
    }

    /// Parent of reply `index`: an original, or with `reply_to_reply_ratio` another reply.
    fn reply_parent(&self, index: u64) -> u64 {
        let start = self.target_start(index);
        if self.unit(index, stream::TARGET_KIND) < self.config.reply_to_reply_ratio
            && let Some(j) = self.walk_back(start, |j| self.kind(j) == Kind::Reply)
        {
            return j;
        }
        self.original_at_or_before(start)
    }

    /// Source of repost `index`: sometimes a video original, otherwise any recent non-repost.
    fn repost_source(&self, index: u64) -> u64 {
        let start = self.target_start(index);
        if self.unit(index, stream::TARGET_KIND) < self.config.repost_video_ratio
            && let Some(j) = self.walk_back(start, |j| {
                self.kind(j) == Kind::Original && self.has_video(j)
            })
        {
            return j;
        }
        let mut j = start;
        while self.kind(j) == Kind::Repost {
            j -= 1;
        }
        j
    }

    /// Root of the conversation post `index` belongs to (itself for an original).
    fn conversation_root(&self, index: u64) -> u64 {
        let mut j = index;
        while self.kind(j) == Kind::Reply {
            j = self.reply_parent(j);
        }
        j
    }

    fn post_id(index: u64) -> i64 {
        POST_ID_BASE + index as i64
    }

    /// Post `index` with `created_at` left at 0 (the caller stamps it).
    fn post(&self, index: u64) -> LightPost {
        let post_id = Self::post_id(index);
        let author_id = self.author_of(index);
        match self.kind(index) {
            Kind::Original => LightPost {
                conversation_id: Some(post_id),
                has_video: self.has_video(index),
                ..LightPost::original(post_id, author_id, 0)
            },
            Kind::Reply => {
                let parent = self.reply_parent(index);
                LightPost {
                    is_reply: true,
                    in_reply_to_post_id: Some(Self::post_id(parent)),
                    in_reply_to_user_id: Some(self.author_of(parent)),
                    conversation_id: Some(Self::post_id(self.conversation_root(parent))),
                    has_video: self.has_video(index),
                    ..LightPost::original(post_id, author_id, 0)
                }
            }
            Kind::Repost => {
                let source = self.repost_source(index);
                LightPost {
                    is_retweet: true,
                    source_post_id: Some(Self::post_id(source)),
                    source_user_id: Some(self.author_of(source)),
                    ..LightPost::original(post_id, author_id, 0)
                }
            }
        }
    }

    /// Backlog creation time of post `index`: evenly spread over the window, non-decreasing.
    #[inline]
    fn created_at(&self, index: u64) -> i64 {
        let posts = self.config.posts.max(1) as i128;
        self.window_start + (index as i128 * self.window_len as i128 / posts) as i64
    }

    fn is_deleted(&self, index: u64) -> bool {
        self.unit(index, stream::DELETE) < self.config.delete_ratio
    }

    fn delete_before_create(&self, index: u64) -> bool {
        // Reuses the DELETE draw: below delete_ratio * share means "before create".
        self.unit(index, stream::DELETE)
            < self.config.delete_ratio * self.config.delete_before_create_ratio
    }

    fn delete_delay_secs(&self, index: u64) -> i64 {
        let u = self.unit(index, stream::DELETE_DELAY);
        (-(1.0 - u).ln() * self.config.delete_mean_delay_secs) as i64 + 1
    }

    fn late_delay_secs(&self, index: u64) -> Option<i64> {
        let u = self.unit(index, stream::LATE);
        if u >= self.config.late_ratio {
            return None;
        }
        let (lo, hi) = self.config.late_delay_secs;
        let span = (hi - lo).max(0) as u64 + 1;
        Some(lo + (self.rnd(index, stream::LATE ^ 0x100) % span) as i64)
    }

    fn jitter_secs(&self, index: u64) -> i64 {
        (self.rnd(index, stream::ARRIVAL) % (self.config.jitter_secs.max(0) as u64 + 1)) as i64
    }

    fn viewer(&self, index: u64) -> Viewer {
        let n = self.config.authors.max(1);
        let mut rng = SmallRng::seed_from_u64(mix(self.key ^ index, stream::VIEWER));
        let user_id = self.author_id(rng.random_range(0..n));
        let wanted = if rng.random::<f64>() < self.config.heavy_viewer_ratio {
            self.config.heavy_follows
        } else {
            self.config.follows
        };
        // Drawing without replacement by rejection needs room: follow at most half the authors.
        let wanted = wanted.min((n as usize).div_ceil(2));
        let mut seen = vec![0u64; (n as usize).div_ceil(64)];
        let mut following = Vec::with_capacity(wanted);
        let mut take = |rank: u64, following: &mut Vec<i64>| {
            let (word, bit) = ((rank / 64) as usize, rank % 64);
            if seen[word] & (1 << bit) == 0 {
                seen[word] |= 1 << bit;
                following.push(self.author_id(rank));
            }
        };
        let mut budget = wanted * 64;
        while following.len() < wanted && budget > 0 {
            budget -= 1;
            let rank = Self::zipf_rank(
                rng.random(),
                self.config.follow_offset,
                self.follow_log_span,
                n,
            );
            take(rank, &mut following);
        }
        let mut rank = 0;
        while following.len() < wanted {
            take(rank, &mut following);
            rank += 1;
        }
        Viewer { user_id, following }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The backlog in arrival order: a streaming iterator over [`PostEvent`]s.
///
/// Posts are generated in `created_at` order and parked in a per-second reorder buffer until
/// their arrival second is complete, so memory holds only events not yet due.
#[derive(Debug)]
pub struct Backlog {
    model: Model,
    next_index: u64,
    /// Pending events; `pending[k]` arrives in second `pending_start_secs + k`.
    pending: VecDeque<Vec<PostEvent>>,
    pending_start_secs: i64,
    ready: std::vec::IntoIter<PostEvent>,
    spare: Vec<Vec<PostEvent>>,
}

impl Backlog {
    fn new(config: &SynthConfig) -> Self {
        let model = Model::new(config);
        let pending_start_secs = model.window_start;
        Self {
            model,
            next_index: 0,
            pending: VecDeque::new(),
            pending_start_secs,
            ready: Vec::new().into_iter(),
            spare: Vec::new(),
        }
    }

    /// Number of posts generated so far (creates emitted or still parked).
    pub fn posts_generated(&self) -> u64 {
        self.next_index
    }

    fn park(&mut self, arrival_secs: i64, event: PostEvent) {
        let slot = (arrival_secs - self.pending_start_secs).max(0) as usize;
        while self.pending.len() <= slot {
            self.pending.push_back(self.spare.pop().unwrap_or_default());
        }
        self.pending[slot].push(event);
    }

    fn generate(&mut self) {
        let index = self.next_index;
        self.next_index += 1;
        let model = &self.model;
        let created_at = model.created_at(index);
        let mut post = model.post(index);
        post.created_at = created_at;
        let now = model.config.now_secs;
        let mut create_arrival = created_at + model.jitter_secs(index);
        let mut delete = None;
        if model.is_deleted(index) {
            if model.delete_before_create(index) {
                let (lo, hi) = model.config.late_delay_secs;
                let late = lo.max(2)
                    + (model.rnd(index, stream::LATE ^ 0x200) % ((hi - lo).max(0) as u64 + 1))
                        as i64;
                create_arrival = created_at + late;
                let deleted_at = created_at
                    + 1
                    + (model.rnd(index, stream::DELETE_DELAY) % (late - 1) as u64) as i64;
                delete = Some((deleted_at, deleted_at));
            } else {
                let deleted_at = (created_at + model.delete_delay_secs(index)).min(now);
                delete = Some((
                    deleted_at,
                    (deleted_at + model.jitter_secs(index ^ 0x5a5a)).max(create_arrival + 1),
                ));
            }
        } else if let Some(late) = model.late_delay_secs(index) {
            create_arrival = created_at + late;
        }
        self.park(create_arrival, PostEvent::Create(post));
        if let Some((deleted_at, arrival)) = delete {
            self.park(
                arrival,
                PostEvent::Delete(DeleteEvent {
                    post_id: post.post_id,
                    deleted_at,
                }),
            );
        }
    }
}

impl Iterator for Backlog {
    type Item = PostEvent;

    fn next(&mut self) -> Option<PostEvent> {
        loop {
            if let Some(event) = self.ready.next() {
                return Some(event);
            }
            let more_posts = self.next_index < self.model.config.posts;
            // A second is complete once every post that could arrive in it has been generated.
            if !self.pending.is_empty()
                && (!more_posts || self.pending_start_secs < self.model.created_at(self.next_index))
            {
                let due = self.pending.pop_front().unwrap_or_default();
                self.pending_start_secs += 1;
                let done = std::mem::replace(&mut self.ready, due.into_iter());
                let mut recycled: Vec<PostEvent> = done.collect();
                recycled.clear();
                if recycled.capacity() > 0 && self.spare.len() < 64 {
                    self.spare.push(recycled);
                }
                continue;
            }
            if more_posts {
                self.generate();
                continue;
            }
            return None;
        }
    }
}

/// New events after the backlog, for a demo trickle or a producer: post ids continue the
/// backlog's sequence, `created_at` is the caller's clock (minus a little jitter), and about
/// `delete_ratio` of new posts are deleted a short while later.
#[derive(Debug)]
pub struct LiveSource {
    model: Model,
    next_index: u64,
    /// Deletes not yet due, ordered by due time (min-heap through `Reverse`).
    pending_deletes: BinaryHeap<std::cmp::Reverse<(i64, i64)>>,
}

impl LiveSource {
    fn new(config: &SynthConfig) -> Self {
        Self {
            model: Model::new(config),
            next_index: config.posts,
            pending_deletes: BinaryHeap::new(),
        }
    }

    /// Index in the post sequence of the next new post (the backlog holds `0..posts`).
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// The next event at time `now_secs`: a due delete if there is one, else a new post.
    pub fn next_event(&mut self, now_secs: i64) -> PostEvent {
        if let Some(std::cmp::Reverse((due, post_id))) = self.pending_deletes.peek().copied()
            && due <= now_secs
        {
            self.pending_deletes.pop();
            return PostEvent::Delete(DeleteEvent {
                post_id,
                deleted_at: now_secs,
            });
        }
        let index = self.next_index;
        self.next_index += 1;
        let model = &self.model;
        let mut post = model.post(index);
        post.created_at = now_secs - model.jitter_secs(index).min(1);
        if model.is_deleted(index) {
            // Live deletes come within minutes, so a demo shows them.
            let delay = model.delete_delay_secs(index).min(600);
            self.pending_deletes
                .push(std::cmp::Reverse((now_secs + delay, post.post_id)));
        }
        PostEvent::Create(post)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    const NOW: i64 = 1_700_000_000;

    fn posts_of(events: &[PostEvent]) -> Vec<LightPost> {
        events
            .iter()
            .filter_map(|e| match e {
                PostEvent::Create(p) => Some(*p),
                PostEvent::Delete(_) => None,
            })
            .collect()
    }

    #[test]
    fn backlog_is_deterministic_and_seed_dependent() {
        let config = SynthConfig::feed_2d(1000, NOW);
        let a: Vec<_> = config.backlog().collect();
        let b: Vec<_> = config.backlog().collect();
        assert_eq!(a, b);
        let c: Vec<_> = config.clone().with_seed(7).backlog().collect();
        assert_ne!(a, c);
        assert_eq!(config.viewer(3), config.viewer(3));
        assert_ne!(config.viewer(3), config.viewer(4));
    }

    #[test]
    fn mix_ratios_match_feed_2d() {
        let config = SynthConfig::feed_2d(100, NOW);
        let events = config.backlog_vec();
        let posts = posts_of(&events);
        assert_eq!(posts.len() as u64, config.posts);
        let n = posts.len() as f64;
        let originals = posts.iter().filter(|p| p.is_original()).count() as f64;
        let replies = posts.iter().filter(|p| p.is_reply).count() as f64;
        let reposts = posts.iter().filter(|p| p.is_retweet).count() as f64;
        assert!(
            (originals / n - 0.60).abs() < 0.01,
            "originals {}",
            originals / n
        );
        assert!((replies / n - 0.25).abs() < 0.01, "replies {}", replies / n);
        assert!((reposts / n - 0.15).abs() < 0.01, "reposts {}", reposts / n);
        let videos = posts
            .iter()
            .filter(|p| p.is_original() && p.has_video)
            .count() as f64;
        assert!(
            (videos / originals - 0.08).abs() < 0.005,
            "video {}",
            videos / originals
        );

        let deletes: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                PostEvent::Delete(d) => Some(*d),
                PostEvent::Create(_) => None,
            })
            .collect();
        let delete_share = deletes.len() as f64 / n;
        assert!(
            (delete_share - 0.01).abs() < 0.002,
            "deletes {delete_share}"
        );
        let position: HashMap<i64, usize> = events
            .iter()
            .enumerate()
            .filter_map(|(k, e)| match e {
                PostEvent::Create(p) => Some((p.post_id, k)),
                PostEvent::Delete(_) => None,
            })
            .collect();
        let early = events
            .iter()
            .enumerate()
            .filter(|(k, e)| matches!(e, PostEvent::Delete(d) if position[&d.post_id] > *k))
            .count() as f64;
        let early_share = early / deletes.len() as f64;
        assert!(
            early_share > 0.02 && early_share < 0.10,
            "delete before create {early_share}"
        );
    }

    #[test]
    fn times_and_targets_are_consistent() {
        let config = SynthConfig::feed_2d(100, NOW);
        let events = config.backlog_vec();
        let posts = posts_of(&events);
        let by_id: HashMap<i64, LightPost> = posts.iter().map(|p| (p.post_id, *p)).collect();
        let mut out_of_order = 0usize;
        let mut late = 0usize;
        let mut newest = i64::MIN;
        for p in &posts {
            assert!(p.created_at <= NOW && NOW - p.created_at < config.window_secs);
            if p.created_at < newest {
                out_of_order += 1;
            }
            if p.created_at + 30 < newest {
                late += 1;
            }
            newest = newest.max(p.created_at);
            if p.is_reply {
                let parent = by_id[&p.in_reply_to_post_id.unwrap()];
                assert_eq!(Some(parent.author_id), p.in_reply_to_user_id);
                assert!(parent.post_id < p.post_id && !parent.is_retweet);
                let root = by_id[&p.conversation_id.unwrap()];
                assert!(root.is_original());
                if parent.is_original() {
                    assert_eq!(p.conversation_id, Some(parent.post_id));
                } else {
                    assert_eq!(p.conversation_id, parent.conversation_id);
                }
            }
            if p.is_retweet {
                let source = by_id[&p.source_post_id.unwrap()];
                assert_eq!(Some(source.author_id), p.source_user_id);
                assert!(!source.is_retweet && !p.has_video);
            }
        }
        let n = posts.len() as f64;
        assert!(out_of_order as f64 / n > 0.05, "jitter reorders arrivals");
        assert!(
            (late as f64 / n) > 0.002 && (late as f64 / n) < 0.02,
            "late share {}",
            late as f64 / n
        );
        let video_sources = posts
            .iter()
            .filter(|p| p.is_retweet && by_id[&p.source_post_id.unwrap()].has_video)
            .count() as f64;
        let reposts = posts.iter().filter(|p| p.is_retweet).count() as f64;
        assert!(
            video_sources / reposts > 0.15,
            "reposts of videos {}",
            video_sources / reposts
        );
    }

    #[test]
    fn activity_is_heavy_tailed() {
        let config = SynthConfig::feed_2d(10, NOW);
        let mut per_author: HashMap<i64, u32> = HashMap::new();
        for p in posts_of(&config.backlog_vec()) {
            *per_author.entry(p.author_id).or_default() += 1;
        }
        let top = *per_author.get(&config.author_id(0)).unwrap_or(&0) as f64;
        // Expected share of rank 0: (1/q) / ln((n + q) / q).
        let expected = config.posts as f64
            / config.activity_offset
            / ((config.authors as f64 + 500.0) / 500.0).ln();
        assert!(
            (top / expected - 1.0).abs() < 0.1,
            "top {top} expected {expected}"
        );
        let mut counts: Vec<u32> = per_author.values().copied().collect();
        counts.sort_unstable();
        let median = counts[counts.len() / 2];
        assert!((2..=20).contains(&median), "median {median}");
    }

    #[test]
    fn viewers_follow_popular_distinct_authors() {
        let config = SynthConfig::feed_2d(10, NOW);
        let viewers = config.viewers(200);
        let heavy = viewers
            .iter()
            .filter(|v| v.following.len() == 10_000)
            .count();
        assert!(
            viewers
                .iter()
                .all(|v| v.following.len() == 2000 || v.following.len() == 10_000)
        );
        assert!((5..=40).contains(&heavy), "heavy {heavy}");
        for v in &viewers {
            let distinct: HashSet<_> = v.following.iter().collect();
            assert_eq!(distinct.len(), v.following.len());
        }
        let popular = config.author_id(0);
        assert!(
            viewers
                .iter()
                .filter(|v| v.following.contains(&popular))
                .count()
                > 150
        );
        // Small scales cap follows at half the authors.
        let tiny = SynthConfig::feed_2d(1000, NOW);
        assert!(tiny.viewers(50).iter().all(|v| v.following.len() <= 500));
    }

    #[test]
    fn exclude_list_samples_the_previous_answer() {
        let config = SynthConfig::feed_2d(100, NOW);
        let viewer = config.viewer(1);
        let answer: Vec<i64> = (0..1200).collect();
        let exclude = exclude_from_answer(&viewer, answer.iter().copied());
        assert_eq!(exclude.len(), EXCLUDE_LIST_LEN);
        assert_eq!(
            exclude,
            exclude_from_answer(&viewer, answer.iter().copied())
        );
        let distinct: HashSet<_> = exclude.iter().collect();
        assert_eq!(distinct.len(), EXCLUDE_LIST_LEN);
        assert!(exclude.iter().all(|id| (0..1200).contains(id)));
        assert_eq!(exclude_from_answer(&viewer, [5, 6]), vec![5, 6]);
    }

    #[test]
    fn live_source_continues_after_the_backlog() {
        let config = SynthConfig::feed_2d(1000, NOW);
        let last_backlog_id = POST_ID_BASE + config.posts as i64 - 1;
        let mut live = config.live();
        let mut creates = 0;
        let mut deletes = 0;
        for k in 0..200_000 {
            let now = NOW + 1 + k / 100;
            match live.next_event(now) {
                PostEvent::Create(p) => {
                    assert!(p.post_id > last_backlog_id);
                    assert!(p.created_at <= now && p.created_at >= now - 1);
                    creates += 1;
                }
                PostEvent::Delete(d) => {
                    assert!(d.post_id > last_backlog_id && d.deleted_at == now);
                    deletes += 1;
                }
            }
        }
        assert!(
            creates > 190_000 && deletes > 1000,
            "creates {creates} deletes {deletes}"
        );
        let mut again = config.live();
        assert_eq!(again.next_event(NOW), config.live().next_event(NOW));
        assert_eq!(again.next_index(), config.posts + 1);
    }

    /// Full scale must stream in seconds: `cargo test --release --features synth -- --ignored`.
    #[test]
    #[ignore]
    fn full_scale_backlog_streams_quickly() {
        let config = SynthConfig::feed_2d(1, NOW);
        let start = std::time::Instant::now();
        let (mut creates, mut deletes) = (0u64, 0u64);
        for event in config.backlog() {
            match event {
                PostEvent::Create(_) => creates += 1,
                PostEvent::Delete(_) => deletes += 1,
            }
        }
        let elapsed = start.elapsed();
        eprintln!("{creates} creates, {deletes} deletes in {elapsed:?}");
        assert_eq!(creates, config.posts);
        let start = std::time::Instant::now();
        let follows: usize = config.viewers(1000).iter().map(|v| v.following.len()).sum();
        eprintln!("1000 viewers ({follows} follows) in {:?}", start.elapsed());
    }
}

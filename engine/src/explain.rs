//! Explaining an answer post by post: for a query and some post ids, what the store knows of
//! each post ([`PostState`]) and which rule of the query kept it out of the answer, or where
//! the answer holds it ([`Verdict`]).
//!
//! The verdicts come from the query that serves answers (`query.rs`), run with an
//! [`ExplainObserver`] that keeps the first decision about each of these posts; nothing here
//! reads the rules a second time. Only what the query never reads is decided before it runs:
//! a post that is not stored, whose author is not asked for, or that no timeline the question
//! reads holds. Once the answer is full the merge goes on (adding nothing to the answer, with
//! no deadline) until every post has its verdict, so a post `max_results` cut off gets its
//! rank.

use std::collections::HashMap;

use crossbeam_epoch::Guard;

use crate::authors::Kind;
use crate::feed_query::{FeedQuery, QueryOutcome};
use crate::guards::Guards;
use crate::observe::{Decision, QueryObserver, Rejection, ReplyRuleMiss, StreamEnd};
use crate::post::LightPost;
use crate::query::{self, Ask};
use crate::tables::StoreTables;

/// A query's answer and the explanation of each post asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// The query's answer (as `get_all_posts_by_users` or `get_videos_by_users` gives it).
    pub outcome: QueryOutcome,
    /// One per post id asked about, in the order asked.
    pub posts: Vec<PostExplanation>,
}

/// What the store knows of one post, and the query's verdict on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostExplanation {
    /// The post asked about.
    pub post_id: i64,
    /// What the store holds of it.
    pub state: PostState,
    /// Where the answer holds it, or the first rule that kept it out.
    pub verdict: Verdict,
}

/// What the store holds of a post.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PostState {
    /// Its record is stored.
    Stored {
        /// The record.
        post: LightPost,
        /// Past retention (queries never return it; a trim frees it).
        expired: bool,
        /// The timelines that hold it.
        timelines: Vec<TimelinePlace>,
    },
    /// Deleted: its tombstone lives.
    Deleted,
    /// On an author shard: a post of an author this shard does not own (it keeps the few
    /// facts the query rules read, not the author).
    OtherShard,
    /// Neither stored nor tombstoned: never seen, or gone (trimmed past retention, evicted
    /// by a full timeline, deleted longer than a retention ago).
    NeverSeen,
}

/// One of an author's timelines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimelineKind {
    /// Neither reply nor repost.
    Originals,
    /// Replies and reposts.
    RepliesAndReposts,
    /// Video candidates.
    Videos,
}

impl TimelineKind {
    fn of(kind: Kind) -> Self {
        match kind {
            Kind::Originals => Self::Originals,
            Kind::Secondary => Self::RepliesAndReposts,
            Kind::Videos => Self::Videos,
        }
    }
}

/// Where a timeline holds a post.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimelinePlace {
    /// Which timeline.
    pub timeline: TimelineKind,
    /// Its place, newest first (1: the newest entry).
    pub position: usize,
    /// Entries the timeline holds.
    pub len: usize,
}

/// The query's verdict on a post: where its answer holds it, or the first rule that kept it
/// out, with that rule's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// In the answer at `position` (1: the first post).
    Returned {
        /// Place in the answer, from 1.
        position: usize,
    },
    /// Not stored (see [`PostState::NeverSeen`]).
    NeverSeen,
    /// Deleted.
    Deleted,
    /// Another author shard's post.
    OtherShard,
    /// Its author is not among the requested authors.
    AuthorNotFollowed,
    /// No timeline the question reads holds it (a videos question reads the videos timeline
    /// only, which holds no reply, no post without a video and no repost of one; a full
    /// timeline evicts its oldest entry).
    NotInTimeline,
    /// Past retention.
    Expired,
    /// Created before the query's `min_created_at`.
    BeforeMinCreatedAt {
        /// The bound.
        min_created_at: i64,
    },
    /// Created after the query's upper bound (`max_created_at`, or the clock it read).
    AfterUpperBound {
        /// The bound.
        upper_bound: i64,
    },
    /// In the query's exclude list.
    Excluded,
    /// In the query's seen filter (false positives included).
    Seen,
    /// A repost in the videos timeline without its own video whose source is no longer a
    /// video source (stored, unexpired, a non-reply with a video).
    VideoRule,
    /// Its author's timeline was read no further than `MAX_TINY_POSTS_PER_USER_SCAN` entries
    /// examined; `newer_entries` entries of that timeline are newer.
    ScanWindow {
        /// Entries of its timeline newer than it.
        newer_entries: usize,
    },
    /// A repost of one of the viewer's own posts.
    ViewerOwnRepost,
    /// The reply rule dropped it.
    ReplyRule(ReplyRuleMiss),
    /// Its author's `limit` newer candidates of its timeline came first (`limit` 0: the stage
    /// is off); `newer_entries` entries of that timeline are newer.
    PerAuthorCap {
        /// The per-author limit of its timeline.
        limit: usize,
        /// Entries of its timeline newer than it.
        newer_entries: usize,
    },
    /// At or before the page position: in an earlier page.
    BeforeCursor,
    /// A candidate ranked `rank` in the answer order after the page position, past
    /// `max_results`.
    CutByMaxResults {
        /// Place it would have had, from 1.
        rank: usize,
    },
    /// Not reached: the query ran out of time first.
    OutOfTime,
    /// Removed while the query ran (deleted, or evicted by a full timeline).
    RemovedMeanwhile,
}

/// Explains `query`'s answer (`ask`) for each of `post_ids` (see the module docs).
pub(crate) fn explain(
    tables: &StoreTables,
    query: &FeedQuery<'_>,
    ask: Ask,
    post_ids: &[i64],
) -> Explanation {
    let states: Vec<PostState> = {
        let g = tables.guards();
        post_ids
            .iter()
            .map(|&post_id| state_of(tables, post_id, &g))
            .collect()
    };
    let mut observer = ExplainObserver::default();
    for (&post_id, state) in post_ids.iter().zip(&states) {
        observer.ask(post_id, state, query, ask);
    }
    let outcome = query::run_observed(tables, query, ask, &mut observer);
    let posts = post_ids
        .iter()
        .zip(states)
        .map(|(&post_id, state)| PostExplanation {
            post_id,
            verdict: observer.verdict(post_id, outcome.timed_out),
            state,
        })
        .collect();
    Explanation { outcome, posts }
}

/// What the store holds of `post_id` now.
fn state_of(tables: &StoreTables, post_id: i64, g: &Guards<'_>) -> PostState {
    if let Some(record) = tables.lookup(post_id, &g.epoch) {
        let post = record.to_light();
        return PostState::Stored {
            expired: tables.retention.expired(record.created_at, g.now),
            timelines: places(tables, post.author_id, post_id, &g.epoch),
            post,
        };
    }
    if tables.tombstones.live(post_id, g).is_some() {
        PostState::Deleted
    } else if tables.fact(post_id, &g.epoch).is_some() {
        PostState::OtherShard
    } else {
        PostState::NeverSeen
    }
}

/// The timelines of `author_id` that hold `post_id`, and where: each timeline as one, its
/// head and base entries together.
fn places(tables: &StoreTables, author_id: i64, post_id: i64, epoch: &Guard) -> Vec<TimelinePlace> {
    let author = tables.authors.find(author_id, epoch);
    let line = tables.base_line(author_id);
    let mut places = Vec::new();
    for kind in Kind::ALL {
        // Newest first, each tier; the two merged by key.
        let mut keys: Vec<(u32, i64)> = Vec::new();
        if let Some(view) = author.and_then(|a| a.timeline(kind).view(epoch)) {
            let mut seq = view.head;
            while seq > view.tail {
                seq -= 1;
                let Some(entry) = view.get(seq) else { break };
                keys.push(entry.key());
            }
        }
        if let Some((base, at)) = line {
            let (run, ..) = base.open_run(at, &base.file.line(at), kind as usize);
            keys.extend(
                (0..usize::from(run.end))
                    .filter_map(|index| base.entry(&run, index))
                    .map(|entry| (entry.created_at, entry.post_id)),
            );
        }
        keys.sort_unstable_by(|a, b| b.cmp(a));
        if let Some(position) = keys.iter().position(|&(_, id)| id == post_id) {
            places.push(TimelinePlace {
                timeline: TimelineKind::of(kind),
                position: position + 1,
                len: keys.len(),
            });
        }
    }
    places
}

/// A post the query has to decide on: in `author_id`'s timeline of `kind`, behind
/// `newer_entries` newer entries.
#[derive(Clone, Copy, Debug)]
struct Asked {
    author_id: i64,
    kind: Kind,
    newer_entries: usize,
    verdict: Option<Verdict>,
}

/// The observer of an explained query: keeps the first decision about each post asked
/// about.
#[derive(Default)]
pub(crate) struct ExplainObserver {
    /// The posts asked about, with their verdict once known.
    asked: HashMap<i64, Asked>,
    /// The posts the query still has to decide on, by the timeline that holds them.
    by_timeline: HashMap<(i64, TimelineKind), Vec<i64>>,
    /// Stream numbers to the timeline each reads.
    streams: Vec<(i64, Kind)>,
    /// Posts asked about without a verdict yet.
    undecided: usize,
}

impl ExplainObserver {
    /// Adds `post_id` (in `state`) to the posts asked about, deciding at once what the query
    /// never reads.
    fn ask(&mut self, post_id: i64, state: &PostState, query: &FeedQuery<'_>, ask: Ask) {
        if self.asked.contains_key(&post_id) {
            return;
        }
        let decided = |verdict| Asked {
            author_id: 0,
            kind: Kind::Originals,
            newer_entries: 0,
            verdict: Some(verdict),
        };
        let asked = match state {
            PostState::NeverSeen => decided(Verdict::NeverSeen),
            PostState::Deleted => decided(Verdict::Deleted),
            PostState::OtherShard => decided(Verdict::OtherShard),
            PostState::Stored {
                post, timelines, ..
            } => {
                let kind = match ask {
                    Ask::AllPosts if post.is_original() => Kind::Originals,
                    Ask::AllPosts => Kind::Secondary,
                    Ask::Videos => Kind::Videos,
                };
                let place = timelines
                    .iter()
                    .find(|p| p.timeline == TimelineKind::of(kind));
                if !query.authors.contains(&post.author_id) {
                    decided(Verdict::AuthorNotFollowed)
                } else if let Some(place) = place {
                    self.undecided += 1;
                    self.by_timeline
                        .entry((post.author_id, TimelineKind::of(kind)))
                        .or_default()
                        .push(post_id);
                    Asked {
                        author_id: post.author_id,
                        kind,
                        newer_entries: place.position - 1,
                        verdict: None,
                    }
                } else {
                    decided(Verdict::NotInTimeline)
                }
            }
        };
        self.asked.insert(post_id, asked);
    }

    /// The verdict on `post_id` after the query (`timed_out`: it ran out of time).
    fn verdict(&self, post_id: i64, timed_out: bool) -> Verdict {
        let asked = self.asked.get(&post_id).and_then(|a| a.verdict);
        asked.unwrap_or(if timed_out {
            Verdict::OutOfTime
        } else {
            // Not reached although the query ended: its author or timeline left meanwhile.
            Verdict::RemovedMeanwhile
        })
    }

    /// Gives `post_id` `verdict` if it has none yet.
    fn decide(&mut self, post_id: i64, verdict: impl FnOnce(&Asked) -> Verdict) {
        if let Some(asked) = self.asked.get_mut(&post_id)
            && asked.verdict.is_none()
        {
            asked.verdict = Some(verdict(asked));
            self.undecided -= 1;
        }
    }

    /// Every post of `timeline` without a verdict gets the one of `why`.
    fn end(&mut self, (author_id, kind): (i64, Kind), why: StreamEnd) {
        let timeline = (author_id, TimelineKind::of(kind));
        let Some(posts) = self.by_timeline.get(&timeline).cloned() else {
            return;
        };
        for post_id in posts {
            self.decide(post_id, |asked| verdict_of_end(why, asked.newer_entries));
        }
    }
}

/// The verdict on a post a stream did not reach because it ended for `why`.
fn verdict_of_end(why: StreamEnd, newer_entries: usize) -> Verdict {
    match why {
        StreamEnd::Limit { limit } => Verdict::PerAuthorCap {
            limit,
            newer_entries,
        },
        StreamEnd::ScanWindow => Verdict::ScanWindow { newer_entries },
        StreamEnd::Expired => Verdict::Expired,
        StreamEnd::BeforeMinCreatedAt { min_created_at } => {
            Verdict::BeforeMinCreatedAt { min_created_at }
        }
        StreamEnd::Exhausted => Verdict::RemovedMeanwhile,
    }
}

/// The verdict on a post a stream reached.
fn verdict_of_decision(decision: Decision) -> Verdict {
    match decision {
        Decision::AfterUpperBound { upper_bound } => Verdict::AfterUpperBound { upper_bound },
        Decision::Excluded => Verdict::Excluded,
        Decision::Seen => Verdict::Seen,
        Decision::Gone => Verdict::RemovedMeanwhile,
        Decision::NotAVideoNow => Verdict::VideoRule,
        Decision::Rejected(Rejection::ViewerOwnRepost) => Verdict::ViewerOwnRepost,
        Decision::Rejected(Rejection::Reply(miss)) => Verdict::ReplyRule(miss),
        Decision::BeforeCursor => Verdict::BeforeCursor,
        Decision::Returned { position } => Verdict::Returned { position },
        Decision::PastTheAnswer { rank } => Verdict::CutByMaxResults { rank },
    }
}

impl QueryObserver for ExplainObserver {
    const RANKS_PAST_THE_ANSWER: bool = true;

    fn opened(&mut self, stream: usize, author_id: i64, kind: Kind) {
        debug_assert_eq!(stream, self.streams.len(), "streams are numbered in order");
        self.streams.push((author_id, kind));
    }

    fn unread(&mut self, author_id: i64, kind: Kind, why: StreamEnd) {
        self.end((author_id, kind), why);
    }

    fn decided(&mut self, stream: usize, post_id: i64, _created_at: u32, decision: Decision) {
        let timeline = self.streams.get(stream).copied();
        if let Some(asked) = self.asked.get(&post_id)
            && timeline == Some((asked.author_id, asked.kind))
        {
            self.decide(post_id, |_| verdict_of_decision(decision));
        }
    }

    fn ended(&mut self, stream: usize, why: StreamEnd) {
        if let Some(&timeline) = self.streams.get(stream) {
            self.end(timeline, why);
        }
    }

    fn satisfied(&self) -> bool {
        self.undecided == 0
    }
}

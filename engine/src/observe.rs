//! The hooks through which the read path reports what each of its rules decided
//! ([`QueryObserver`]). The serving path passes [`Unobserved`], whose hooks are empty and
//! compile away; the explain path (`explain.rs`) passes one that turns the decisions about the
//! posts it was asked about into verdicts.
//!
//! The hooks speak of rule decisions, not of the structures the rules read: a stream is the
//! number a query gives one timeline it reads (`opened` names its author and kind), an entry is
//! a post id and its `created_at`, and every decision names its rule and the figures it used.
//! Any kind of stream a query merges reports through the same hooks.

use crate::authors::Kind;

/// Why a stream reads no further: every entry at or older than where it stopped, which it did
/// not decide on itself, shares the reason. The same reasons say why a timeline is not read at
/// all ([`QueryObserver::unread`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamEnd {
    /// The author's per-author limit of this kind (0: the stage is off) is filled.
    Limit {
        /// The limit.
        limit: usize,
    },
    /// `MAX_TINY_POSTS_PER_USER_SCAN` entries were examined.
    ScanWindow,
    /// An entry past retention: it and everything older are.
    Expired,
    /// An entry created before the window's `min_created_at`: it and everything older are.
    BeforeMinCreatedAt {
        /// The bound.
        min_created_at: i64,
    },
    /// Nothing older is left in the timeline (or the writer evicted it meanwhile).
    Exhausted,
}

/// Why the reply rule or the self-repost filter dropped a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// A repost of one of the viewer's own posts.
    ViewerOwnRepost,
    /// A reply the reply rule drops, and why.
    Reply(ReplyRuleMiss),
}

/// Which part of the reply rule (secondary timeline) a reply failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplyRuleMiss {
    /// Its parent is not stored (never seen, deleted, trimmed or evicted).
    ParentMissing,
    /// Its parent is stored but past retention.
    ParentExpired,
    /// Its parent is a reply, and its `conversation_id` is not the parent's
    /// `in_reply_to_post_id`.
    ConversationMismatch,
    /// Its parent is a reply in the same conversation, but the author it replies to
    /// (`in_reply_to_user_id`) is not among the requested authors.
    ReplyToUnfollowed,
}

/// What the rules decided about one entry a stream reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Created after the query's upper bound (`max_created_at`, or the clock it read):
    /// skipped as absent.
    AfterUpperBound {
        /// The bound.
        upper_bound: i64,
    },
    /// In the request's exclude list: skipped.
    Excluded,
    /// In the seen filter (false positives too): skipped.
    Seen,
    /// Its record left while the query ran (deleted or evicted).
    Gone,
    /// A videos entry without its own video whose source is no longer a video source.
    NotAVideoNow,
    /// Examined, then dropped.
    Rejected(Rejection),
    /// A candidate at or before the page position: in an earlier page.
    BeforeCursor,
    /// A candidate in the answer, at `position` (1: the first post).
    Returned {
        /// Place in the answer, from 1.
        position: usize,
    },
    /// A candidate past `max_results`, at `rank` in the answer order after the page position
    /// (only observers that rank past the answer see it).
    PastTheAnswer {
        /// Place it would have had, from 1.
        rank: usize,
    },
}

/// Receives the read path's decisions (see the module docs). Every hook is called on the
/// query's thread, in the order the query decides.
pub(crate) trait QueryObserver {
    /// Whether the merge goes on once the answer is full (while [`satisfied`](Self::satisfied)
    /// is false), so that the posts `max_results` cuts off get their rank.
    const RANKS_PAST_THE_ANSWER: bool;

    /// Stream number `stream` reads `author_id`'s timeline of `kind`.
    fn opened(&mut self, stream: usize, author_id: i64, kind: Kind);

    /// `author_id`'s timeline of `kind` is requested but not read, for `why`.
    fn unread(&mut self, author_id: i64, kind: Kind, why: StreamEnd);

    /// Stream `stream` reached `post_id` (created at `created_at`) and the rules decided.
    fn decided(&mut self, stream: usize, post_id: i64, created_at: u32, decision: Decision);

    /// Stream `stream` reads no further, for `why`.
    fn ended(&mut self, stream: usize, why: StreamEnd);

    /// True once the observer needs nothing more from a query whose answer is full.
    fn satisfied(&self) -> bool;
}

/// The serving path's observer: it observes nothing, and the hooks compile away.
pub(crate) struct Unobserved;

impl QueryObserver for Unobserved {
    const RANKS_PAST_THE_ANSWER: bool = false;

    #[inline(always)]
    fn opened(&mut self, _stream: usize, _author_id: i64, _kind: Kind) {}

    #[inline(always)]
    fn unread(&mut self, _author_id: i64, _kind: Kind, _why: StreamEnd) {}

    #[inline(always)]
    fn decided(&mut self, _stream: usize, _post_id: i64, _created_at: u32, _decision: Decision) {}

    #[inline(always)]
    fn ended(&mut self, _stream: usize, _why: StreamEnd) {}

    #[inline(always)]
    fn satisfied(&self) -> bool {
        true
    }
}

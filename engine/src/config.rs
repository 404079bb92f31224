//! Constants of the reference service, under the reference's names.

/// Default `max_results` for non-video requests.
pub const MAX_POSTS_TO_RETURN: usize = 1200;
/// Default `max_results` for video requests.
pub const MAX_VIDEOS_TO_RETURN: usize = 600;
/// Truncation length of `following_user_ids` and `exclude_tweet_ids`.
pub const MAX_INPUT_LIST_SIZE: usize = 10_000;
/// Per-author cap of the secondary (replies + reposts) stage; upper clamp of a request's limit.
pub const MAX_REPLY_POSTS_PER_AUTHOR: usize = 30;
/// Per-author cap of the originals stage; upper clamp of a request's limit.
pub const MAX_ORIGINAL_POSTS_PER_AUTHOR: usize = 50;
/// Per-author cap of video requests.
pub const MAX_VIDEO_POSTS_PER_AUTHOR: usize = 100;
/// Most live timeline entries examined per author and timeline in one query.
pub const MAX_TINY_POSTS_PER_USER_SCAN: usize = 500;
/// Length cap of every per-author timeline; the oldest entry is evicted beyond it.
pub const MAX_POSTING_LIST_SIZE: usize = 5000;
/// Number of author shards trimmed in turn (`author_id mod TRIM_FRACTION`).
pub const TRIM_FRACTION: usize = 5;
/// Default retention window: two days.
pub const DEFAULT_RETENTION_SECS: i64 = 2 * 24 * 60 * 60;

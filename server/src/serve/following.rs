//! Follow-graph fallback: where the server gets a viewer's following list when a request
//! arrives with an empty one (the reference's Strato `fetch_following_list`).
//!
//! None is configured by default. With one configured, every request whose
//! `following_user_ids` is empty uses it, whatever `debug` says.

use std::collections::HashMap;

/// Fetches the accounts a user follows.
#[tonic::async_trait]
pub trait FollowingSource: Send + Sync + std::fmt::Debug {
    /// Up to `limit` ids that `user_id` follows. The error text is returned to the caller as
    /// `INTERNAL "Failed to fetch following list: {error}"`.
    async fn fetch_following_list(&self, user_id: i64, limit: usize) -> Result<Vec<i64>, String>;
}

/// A fixed follow graph held in memory (demo mode, tests).
#[derive(Debug, Default, Clone)]
pub struct StaticFollowing {
    following: HashMap<i64, Vec<i64>>,
}

impl StaticFollowing {
    /// A graph where `user_id` follows the given ids.
    pub fn new(following: HashMap<i64, Vec<i64>>) -> Self {
        Self { following }
    }
}

#[tonic::async_trait]
impl FollowingSource for StaticFollowing {
    async fn fetch_following_list(&self, user_id: i64, limit: usize) -> Result<Vec<i64>, String> {
        Ok(self
            .following
            .get(&user_id)
            .map(|ids| ids.iter().copied().take(limit).collect())
            .unwrap_or_default())
    }
}

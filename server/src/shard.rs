//! Author sharding on the server side (`--shard I/N`, env `THUNDER_SHARD`).
//!
//! A shard consumes the whole topic like a full replica. It stores the posts of the authors
//! [`thunder_proto::shard::shard_of`] maps to it and, for every other post, only the facts the
//! query rules read across authors (a reply's parent, a repost's source: see
//! `thunder_engine`'s fact directory); every delete is applied, since deletes are keyed by post
//! id. Its answer to a request naming any authors is then exactly a full replica's answer
//! restricted to its own authors, so a client that asks every shard owning a followed author
//! with the whole following list and merges the answers newest first gets the full answer
//! (`thunder-client` does that).

use thunder_engine::{PostStore, ShardId};
use thunder_proto::shard::ShardSpec;

/// The store of a full replica (`shard` is `None`) or of one author shard.
pub fn new_store(retention_secs: i64, shard: Option<ShardSpec>) -> PostStore {
    let store = PostStore::new(retention_secs);
    match shard {
        None => store,
        Some(spec) => {
            tracing::info!(shard = %spec, "author shard: storing the authors of shard {spec} and the facts of the others");
            let id = ShardId {
                index: spec.index,
                count: spec.count,
            };
            store.with_author_shard(id, move |author_id| spec.owns(author_id))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use thunder_engine::{FeedQuery, LightPost};
    use thunder_proto::shard::shard_of;

    #[test]
    fn a_shard_keeps_only_its_authors_posts() {
        let spec = ShardSpec { index: 1, count: 2 };
        let store = new_store(3600, Some(spec));
        let now = store.now_secs();
        let authors: Vec<i64> = (1..40).collect();
        let posts: Vec<LightPost> = authors
            .iter()
            .map(|&a| LightPost::original(1000 + a, a, now - a))
            .collect();
        store.insert_posts(&posts);
        let answer = store.get_all_posts_by_users(&FeedQuery::new(0, &authors));
        let mine: Vec<i64> = authors
            .iter()
            .copied()
            .filter(|&a| shard_of(a, 2) == 1)
            .map(|a| 1000 + a)
            .collect();
        let got: Vec<i64> = answer.posts.iter().map(|p| p.post_id).collect();
        assert_eq!(got, mine);
        let stats = store.directory_stats().expect("a shard has a directory");
        assert_eq!(stats.facts, authors.len() - mine.len());
        assert_eq!(new_store(3600, None).directory_stats(), None);
    }
}

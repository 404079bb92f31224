//! thunder-client: a fail-open async client of the in-network post store
//! (`thunder.v1.InNetworkPostsService/GetInNetworkPosts`).
//!
//! A feed mixer asks this store for candidates next to other sources and must serve the feed
//! even when a source fails, so a call never fails: it returns a [`FeedAnswer`] with the posts
//! it got, `complete` and the per-shard errors. Callers that want errors use
//! [`FeedAnswer::into_result`].
//!
//! Per call, outermost first:
//! 1. **deadline**: the caller's timeout bounds everything; each attempt sends what is left as
//!    `grpc-timeout`, so the server bounds its query by it and answers in time;
//! 2. **fallback**: a shard that fails or runs out of time contributes no posts and one
//!    [`ShardError`]; the other shards' posts are returned;
//! 3. **retry**: only UNAVAILABLE (refused or broken connections, a replica shutting down),
//!    within a `tower` `TpsBudget` (retries at most a share of the calls, plus a small reserve
//!    per second), never past the deadline;
//! 4. **hedge** (`tower::hedge`): when an attempt is slower than a latency percentile of recent
//!    calls, a second one goes to another replica and the first answer wins; hedges are
//!    rate-capped by their own `TpsBudget`;
//! 5. **balance**: power of two choices over requests in flight per replica, skipping replicas
//!    that just failed to connect (see `replicas.rs`).
//!
//! # Shards
//! With [`ThunderClient::sharded`], every group of addresses is one author shard (servers
//! started with `--shard I/N`, in the order `I`). A call asks every shard that owns at least
//! one followed author ([`thunder_proto::shard::shard_of`]), in parallel, merges the answers
//! newest first and cuts them at the request's `max_results`. Each shard receives the whole
//! following list: the reply rule keeps a reply to a reply only if the parent's author is
//! followed, and that author may live on another shard; a shard holds no posts of the other
//! shards' authors, so naming them costs one missed lookup each and adds nothing else.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use thunder_proto::shard::shard_of;
use thunder_proto::{GetInNetworkPostsRequest, GetInNetworkPostsResponse, LightPost};
use tokio::time::Instant;
use tonic::{Code, Status};
use tower::hedge::Hedge;
use tower::retry::budget::{Budget, TpsBudget};
use tower::{Service, ServiceExt};

mod replicas;

use replicas::{Attempt, ReplicaSet};

/// Default `max_results` of a non-video request (the server's rule).
pub const DEFAULT_MAX_RESULTS: u32 = 1200;
/// Default `max_results` of a video request (the server's rule).
pub const DEFAULT_MAX_VIDEO_RESULTS: u32 = 600;
/// Largest `max_results` the server honours.
pub const MAX_RESULTS_CAP: u32 = 10_000;

/// What can go wrong building a client (calls themselves never fail, see [`FeedAnswer`]).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An address is not a valid endpoint.
    #[error("replica address {address:?}: {reason}")]
    Address {
        /// The address as given.
        address: String,
        /// Why it was refused.
        reason: String,
    },
    /// A shard group (or the whole client) was given no address.
    #[error("a shard needs at least one replica address")]
    NoReplicas,
    /// A setting is out of range.
    #[error("client setting {0}")]
    Config(String),
}

/// Tuning of the client stack; [`Default`] suits a feed mixer calling with ~100 ms budgets.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// TCP connect timeout per replica.
    pub connect_timeout: Duration,
    /// How long a replica that answered UNAVAILABLE is left out of the balancer's choice.
    pub eject_for: Duration,
    /// Retries allowed as a share of calls (0.0 ..= 1000.0), over `budget_window`.
    pub retry_ratio: f32,
    /// Retries allowed per second whatever the call volume (so a quiet client can retry).
    pub retry_reserve_per_sec: u32,
    /// Hedged attempts allowed as a share of calls, over `budget_window`.
    pub hedge_ratio: f32,
    /// Hedged attempts allowed per second whatever the call volume.
    pub hedge_reserve_per_sec: u32,
    /// Window the retry and hedge budgets remember calls over (1 ..= 60 s).
    pub budget_window: Duration,
    /// Hedge after this percentile of recent attempt latencies (0.0 ..= 100.0); `None` never
    /// hedges.
    pub hedge_percentile: Option<f32>,
    /// Latencies recorded before the first hedge (the percentile needs data).
    pub hedge_min_samples: u64,
    /// Period over which hedge latencies are recorded (tower's rotating histogram, which
    /// reads the previous period's latencies: hedging starts one period after the first call).
    pub hedge_window: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_millis(500),
            eject_for: Duration::from_secs(1),
            retry_ratio: 0.2,
            retry_reserve_per_sec: 10,
            hedge_ratio: 0.1,
            hedge_reserve_per_sec: 1,
            budget_window: Duration::from_secs(10),
            hedge_percentile: Some(95.0),
            hedge_min_samples: 100,
            hedge_window: Duration::from_secs(10),
        }
    }
}

impl ClientConfig {
    fn budget(&self, ratio: f32, reserve: u32) -> Result<TpsBudget, ClientError> {
        if !(1..=60).contains(&self.budget_window.as_secs()) {
            return Err(ClientError::Config(format!(
                "budget_window {:?} must be 1 ..= 60 s",
                self.budget_window
            )));
        }
        if !(0.0..=1000.0).contains(&ratio) {
            return Err(ClientError::Config(format!(
                "ratio {ratio} must be 0 ..= 1000"
            )));
        }
        Ok(TpsBudget::new(self.budget_window, reserve, ratio))
    }
}

/// Why one shard contributed no posts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardError {
    /// The shard (its position among the groups given to the client).
    pub shard: usize,
    /// The last attempt's gRPC status code (`DeadlineExceeded` when the caller's time ran out).
    pub code: Code,
    /// The last attempt's status message.
    pub message: String,
    /// Attempts made (retries included, hedges not).
    pub attempts: u32,
}

impl std::fmt::Display for ShardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "shard {}: {:?} after {} attempt(s): {}",
            self.shard, self.code, self.attempts, self.message
        )
    }
}

/// The answer of one call: the posts that could be had, newest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FeedAnswer {
    /// The posts, newest first, at most the request's `max_results`.
    pub posts: Vec<LightPost>,
    /// Every shard asked answered (the posts are what a full replica would return).
    pub complete: bool,
    /// One entry per shard that failed.
    pub errors: Vec<ShardError>,
}

/// A call that did not complete, for callers that ask for errors.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{} shard(s) failed, {} posts from the others; first: {}", errors.len(), partial.len(), errors.first().map(ToString::to_string).unwrap_or_default())]
pub struct IncompleteAnswer {
    /// The posts the other shards returned.
    pub partial: Vec<LightPost>,
    /// The failed shards.
    pub errors: Vec<ShardError>,
}

impl FeedAnswer {
    /// The posts if every shard answered, else the error with what was had.
    pub fn into_result(self) -> Result<Vec<LightPost>, IncompleteAnswer> {
        if self.complete {
            Ok(self.posts)
        } else {
            Err(IncompleteAnswer {
                partial: self.posts,
                errors: self.errors,
            })
        }
    }
}

/// Hedge policy: clone any request whose deadline has not passed; hedge it if the hedge
/// budget allows.
#[derive(Clone)]
struct HedgePolicy {
    budget: Arc<TpsBudget>,
}

impl tower::hedge::Policy<Attempt> for HedgePolicy {
    fn clone_request(&self, attempt: &Attempt) -> Option<Attempt> {
        (Instant::now() < attempt.deadline).then(|| attempt.clone())
    }

    fn can_retry(&self, attempt: &Attempt) -> bool {
        Instant::now() < attempt.deadline && self.budget.withdraw()
    }
}

/// The replicas of one shard behind retry and hedge.
struct ShardGroup {
    replicas: ReplicaSet,
    /// `None` when hedging is off.
    hedged: Option<tokio::sync::Mutex<Hedge<ReplicaSet, HedgePolicy>>>,
    hedge_budget: Arc<TpsBudget>,
    retry_budget: TpsBudget,
}

impl ShardGroup {
    fn new(addrs: &[String], config: &ClientConfig) -> Result<Self, ClientError> {
        let replicas = ReplicaSet::new(addrs, config.connect_timeout, config.eject_for)?;
        let hedge_budget =
            Arc::new(config.budget(config.hedge_ratio, config.hedge_reserve_per_sec)?);
        let hedged = match config.hedge_percentile {
            Some(p) if (0.0..=100.0).contains(&p) => Some(tokio::sync::Mutex::new(Hedge::new(
                replicas.clone(),
                HedgePolicy {
                    budget: Arc::clone(&hedge_budget),
                },
                config.hedge_min_samples,
                p / 100.0,
                config.hedge_window,
            ))),
            Some(p) => {
                return Err(ClientError::Config(format!(
                    "hedge_percentile {p} must be 0 ..= 100"
                )));
            }
            None => None,
        };
        Ok(Self {
            replicas,
            hedged,
            hedge_budget,
            retry_budget: config.budget(config.retry_ratio, config.retry_reserve_per_sec)?,
        })
    }

    /// One attempt through the hedge (or straight to the balancer).
    async fn attempt(&self, attempt: Attempt) -> Result<GetInNetworkPostsResponse, Status> {
        let Some(hedged) = &self.hedged else {
            return self.replicas.clone().call(attempt).await;
        };
        let call = {
            let mut hedge = hedged.lock().await;
            match hedge.ready().await {
                Ok(hedge) => hedge.call(attempt),
                Err(e) => return Err(into_status(e)),
            }
        };
        call.await.map_err(into_status)
    }

    /// Attempts until an answer, a non-retryable error, an empty retry budget or the deadline.
    async fn call(
        &self,
        shard: usize,
        request: GetInNetworkPostsRequest,
        deadline: Instant,
    ) -> Result<GetInNetworkPostsResponse, ShardError> {
        self.retry_budget.deposit();
        self.hedge_budget.deposit();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let attempt = Attempt {
                request: request.clone(),
                deadline,
            };
            let status = match tokio::time::timeout_at(deadline, self.attempt(attempt)).await {
                Ok(Ok(answer)) => return Ok(answer),
                // tonic servers answer CANCELLED "Timeout expired" when the grpc-timeout we sent
                // runs out: the caller's deadline, as seen by the server.
                Ok(Err(status))
                    if status.code() == Code::Cancelled
                        && status.message().contains("Timeout expired") =>
                {
                    Status::deadline_exceeded(status.message())
                }
                Ok(Err(status)) => status,
                Err(_elapsed) => Status::deadline_exceeded("the caller's deadline passed"),
            };
            // Jittered exponential backoff (2 ms doubling to 200 ms), so a shard whose
            // replicas all refuse is not hammered for the whole budget.
            let backoff_ms = (2u64 << (attempts - 1).min(7)).min(200);
            let wake = Instant::now()
                + Duration::from_millis(rand::rng().random_range(backoff_ms / 2..=backoff_ms));
            let retry = replica_gone(&status) && wake < deadline && self.retry_budget.withdraw();
            if !retry {
                return Err(ShardError {
                    shard,
                    code: status.code(),
                    message: status.message().to_owned(),
                    attempts,
                });
            }
            tokio::time::sleep_until(wake).await;
        }
    }
}

/// Whether `status` says the replica did not serve the call (it is down, draining, or its
/// connection closed under the call: a read is safe to ask again elsewhere): `UNAVAILABLE`, or
/// `CANCELLED` other than the server's own "Timeout expired" (hyper's "operation was canceled"
/// when a replica's connection goes away mid-call).
pub(crate) fn replica_gone(status: &Status) -> bool {
    match status.code() {
        Code::Unavailable => true,
        Code::Cancelled => !status.message().contains("Timeout expired"),
        _ => false,
    }
}

fn into_status(error: tower::BoxError) -> Status {
    match error.downcast::<Status>() {
        Ok(status) => *status,
        Err(other) => Status::unknown(other.to_string()),
    }
}

/// A fail-open client over one replicated store or a fleet of author shards.
pub struct ThunderClient {
    shards: Vec<ShardGroup>,
}

impl std::fmt::Debug for ThunderClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThunderClient")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl ThunderClient {
    /// A client of identical full replicas (`host:port` or `http://host:port` each).
    /// Connections are made lazily, on first use.
    pub fn replicas(addrs: &[String], config: &ClientConfig) -> Result<Self, ClientError> {
        Self::sharded(&[addrs.to_vec()], config)
    }

    /// A client of author shards: `groups[i]` are the replicas of shard `i/groups.len()`.
    pub fn sharded(groups: &[Vec<String>], config: &ClientConfig) -> Result<Self, ClientError> {
        if groups.is_empty() {
            return Err(ClientError::NoReplicas);
        }
        let shards = groups
            .iter()
            .map(|addrs| ShardGroup::new(addrs, config))
            .collect::<Result<_, _>>()?;
        Ok(Self { shards })
    }

    /// Parses `"ADDR,ADDR;ADDR"`: shards separated by `;`, replicas of a shard by `,`.
    pub fn parse_shards(spec: &str) -> Result<Vec<Vec<String>>, ClientError> {
        spec.split(';')
            .map(|group| {
                let addrs: Vec<String> = group
                    .split(',')
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .map(str::to_owned)
                    .collect();
                if addrs.is_empty() {
                    Err(ClientError::NoReplicas)
                } else {
                    Ok(addrs)
                }
            })
            .collect()
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Calls answered per replica of `shard` (attempts and hedges, any status), address order.
    pub fn replica_answers(&self, shard: usize) -> Vec<u64> {
        self.shards
            .get(shard)
            .map(|s| s.replicas.answered())
            .unwrap_or_default()
    }

    /// The shards owning at least one of `request`'s followed authors (all of them for an
    /// unsharded client).
    pub fn shards_for(&self, request: &GetInNetworkPostsRequest) -> Vec<usize> {
        let count = self.shards.len() as u32;
        if count == 1 {
            return vec![0];
        }
        let mut asked = vec![false; self.shards.len()];
        for &author in &request.following_user_ids {
            // Ids above i64::MAX are refused by every server; route them anywhere.
            asked[shard_of(author as i64, count) as usize] = true;
        }
        (0..self.shards.len()).filter(|&s| asked[s]).collect()
    }

    /// The newest posts of the request's followed authors, from every shard that owns one,
    /// within `timeout`. Never fails: see [`FeedAnswer`].
    pub async fn get_in_network_posts(
        &self,
        request: GetInNetworkPostsRequest,
        timeout: Duration,
    ) -> FeedAnswer {
        let deadline = Instant::now() + timeout;
        let max_results = effective_max_results(&request);
        let asked = self.shards_for(&request);
        let calls = asked
            .iter()
            .map(|&s| self.shards[s].call(s, request.clone(), deadline));
        let results = futures_util::future::join_all(calls).await;
        let mut answers = Vec::with_capacity(results.len());
        let mut errors = Vec::new();
        for result in results {
            match result {
                Ok(answer) => answers.push(answer.posts),
                Err(error) => errors.push(error),
            }
        }
        FeedAnswer {
            posts: merge_newest_first(answers, max_results as usize),
            complete: errors.is_empty(),
            errors,
        }
    }
}

/// The `max_results` the server applies to `request`: 0 means the default, values above the
/// cap are cut to it.
pub fn effective_max_results(request: &GetInNetworkPostsRequest) -> u32 {
    match request.max_results {
        0 if request.is_video_request => DEFAULT_MAX_VIDEO_RESULTS,
        0 => DEFAULT_MAX_RESULTS,
        n => n.min(MAX_RESULTS_CAP),
    }
}

/// Merges the answers of author shards (each newest first) into one, newest first, cut at
/// `max_results`, in the store's own total order (`engine/BEHAVIOUR.md`): among equal
/// `created_at`, the larger post id first.
pub fn merge_newest_first(answers: Vec<Vec<LightPost>>, max_results: usize) -> Vec<LightPost> {
    let mut answers: Vec<_> = answers
        .into_iter()
        .filter(|a| !a.is_empty())
        .map(|a| a.into_iter().peekable())
        .collect();
    if answers.len() == 1 {
        return answers.swap_remove(0).take(max_results).collect();
    }
    let rank = |post: &LightPost| (post.created_at, post.post_id);
    let total: usize = answers.iter().map(|a| a.len()).sum();
    let mut merged = Vec::with_capacity(total.min(max_results));
    while merged.len() < max_results {
        let mut best = None;
        for (i, answer) in answers.iter_mut().enumerate() {
            if let Some(post) = answer.peek() {
                let key = rank(post);
                if best.as_ref().is_none_or(|(_, top)| key > *top) {
                    best = Some((i, key));
                }
            }
        }
        let Some((i, _)) = best else { break };
        if let Some(post) = answers[i].next() {
            merged.push(post);
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(post_id: i64, created_at: i64) -> LightPost {
        LightPost {
            post_id,
            author_id: post_id,
            created_at,
            ..LightPost::default()
        }
    }

    /// A replica whose connection closed under the call (hyper's cancel) is asked again
    /// elsewhere; the server's own deadline and the other codes are not.
    #[test]
    fn a_replica_gone_under_the_call_is_retried() {
        assert!(replica_gone(&Status::unavailable("draining")));
        assert!(replica_gone(&Status::cancelled("operation was canceled")));
        assert!(!replica_gone(&Status::cancelled("Timeout expired")));
        assert!(!replica_gone(&Status::invalid_argument("bad")));
        assert!(!replica_gone(&Status::deadline_exceeded("late")));
    }

    #[test]
    fn merges_newest_first_and_cuts() {
        let a = vec![post(1, 50), post(2, 30), post(3, 10)];
        let b = vec![post(4, 40), post(5, 30), post(6, 20)];
        let ids = |v: Vec<LightPost>| v.into_iter().map(|p| p.post_id).collect::<Vec<_>>();
        // Posts 2 and 5 tie at 30: the larger id first, as in the store, whichever shard.
        assert_eq!(
            ids(merge_newest_first(vec![a.clone(), b.clone()], 100)),
            [1, 4, 5, 2, 6, 3]
        );
        assert_eq!(
            ids(merge_newest_first(vec![b.clone(), a.clone()], 100)),
            [1, 4, 5, 2, 6, 3]
        );
        assert_eq!(ids(merge_newest_first(vec![a.clone(), b], 3)), [1, 4, 5]);
        assert_eq!(ids(merge_newest_first(vec![vec![], a], 2)), [1, 2]);
        assert!(merge_newest_first(vec![], 5).is_empty());
    }

    #[test]
    fn parses_shard_groups() {
        assert_eq!(
            ThunderClient::parse_shards("a:1, b:2;c:3").ok(),
            Some(vec![
                vec!["a:1".to_owned(), "b:2".to_owned()],
                vec!["c:3".to_owned()]
            ])
        );
        assert!(ThunderClient::parse_shards("a:1;;c:3").is_err());
        assert!(ThunderClient::parse_shards("").is_err());
    }

    #[test]
    fn applies_the_server_defaults() {
        let mut request = GetInNetworkPostsRequest::default();
        assert_eq!(effective_max_results(&request), 1200);
        request.is_video_request = true;
        assert_eq!(effective_max_results(&request), 600);
        request.max_results = 50_000;
        assert_eq!(effective_max_results(&request), 10_000);
    }

    #[tokio::test]
    async fn routes_authors_to_their_shards() {
        let groups = vec![
            vec!["127.0.0.1:1".to_owned()],
            vec!["127.0.0.1:2".to_owned()],
        ];
        let client = ThunderClient::sharded(&groups, &ClientConfig::default()).expect("client");
        let on = |shard: u32| (0..).find(|&a| shard_of(a, 2) == shard).map(|a| a as u64);
        let request = |authors: Vec<u64>| GetInNetworkPostsRequest {
            following_user_ids: authors,
            ..Default::default()
        };
        let (zero, one) = (on(0).unwrap_or(0), on(1).unwrap_or(0));
        assert_eq!(client.shards_for(&request(vec![zero])), [0]);
        assert_eq!(client.shards_for(&request(vec![one])), [1]);
        assert_eq!(client.shards_for(&request(vec![one, zero])), [0, 1]);
        assert!(client.shards_for(&request(vec![])).is_empty());
    }
}

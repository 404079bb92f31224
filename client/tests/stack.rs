//! The client stack against real gRPC servers on loopback whose behaviour the test controls
//! (slow every n-th call, always slow, failing with a given status, or not listening at all).
//! Every test also runs a control that shows the property would be missed without the layer
//! it checks, where that is measurable.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use thunder_client::{ClientConfig, FeedAnswer, ThunderClient};
use thunder_proto::in_network_posts_service_server::{
    InNetworkPostsService, InNetworkPostsServiceServer,
};
use thunder_proto::{GetInNetworkPostsRequest, GetInNetworkPostsResponse, LightPost};
use tonic::{Code, Request, Response, Status};

/// How a fake replica answers its n-th call (counting from 0).
#[derive(Clone, Copy)]
enum Behaviour {
    /// Answers at once.
    Fast,
    /// Sleeps this long on every `every`-th call.
    SlowEvery { every: u64, delay: Duration },
    /// Sleeps this long on every call.
    Slow(Duration),
    /// Fails with this code.
    Fails(Code),
}

struct Fake {
    behaviour: Behaviour,
    posts: Vec<LightPost>,
    calls: Arc<AtomicU64>,
    timeouts_seen: Arc<Mutex<Vec<Option<String>>>>,
}

#[tonic::async_trait]
impl InNetworkPostsService for Fake {
    async fn get_in_network_posts(
        &self,
        request: Request<GetInNetworkPostsRequest>,
    ) -> Result<Response<GetInNetworkPostsResponse>, Status> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.timeouts_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(timeout);
        match self.behaviour {
            Behaviour::Fast => {}
            Behaviour::SlowEvery { every, delay } => {
                if n % every == every - 1 {
                    tokio::time::sleep(delay).await;
                }
            }
            Behaviour::Slow(delay) => tokio::time::sleep(delay).await,
            Behaviour::Fails(code) => return Err(Status::new(code, "told to fail")),
        }
        Ok(Response::new(GetInNetworkPostsResponse {
            posts: self.posts.clone(),
            ..Default::default()
        }))
    }
}

struct Replica {
    addr: SocketAddr,
    calls: Arc<AtomicU64>,
    timeouts_seen: Arc<Mutex<Vec<Option<String>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Replica {
    async fn start(behaviour: Behaviour, posts: Vec<LightPost>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let calls = Arc::new(AtomicU64::new(0));
        let timeouts_seen = Arc::new(Mutex::new(Vec::new()));
        let fake = Fake {
            behaviour,
            posts,
            calls: Arc::clone(&calls),
            timeouts_seen: Arc::clone(&timeouts_seen),
        };
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(InNetworkPostsServiceServer::new(fake))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Self {
            addr,
            calls,
            timeouts_seen,
            task,
        }
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An address nothing listens on (bound, then released).
async fn dead_address() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    addr.to_string()
}

fn post(post_id: i64, author_id: i64, created_at: i64) -> LightPost {
    LightPost {
        post_id,
        author_id,
        created_at,
        ..LightPost::default()
    }
}

fn request() -> GetInNetworkPostsRequest {
    GetInNetworkPostsRequest {
        user_id: 1,
        following_user_ids: vec![1, 2, 3],
        ..Default::default()
    }
}

fn no_hedging() -> ClientConfig {
    ClientConfig {
        hedge_percentile: None,
        ..ClientConfig::default()
    }
}

/// Sequential calls; the slowest call's latency.
async fn slowest_of(client: &ThunderClient, calls: usize, timeout: Duration) -> Duration {
    let mut slowest = Duration::ZERO;
    for _ in 0..calls {
        let start = Instant::now();
        let answer = client.get_in_network_posts(request(), timeout).await;
        assert!(answer.complete, "{:?}", answer.errors);
        slowest = slowest.max(start.elapsed());
    }
    slowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedging_hides_a_replica_that_is_sometimes_slow() {
    let delay = Duration::from_millis(600);
    let run = |hedge: bool| async move {
        let a = Replica::start(
            Behaviour::SlowEvery { every: 8, delay },
            vec![post(1, 1, 10)],
        )
        .await;
        let b = Replica::start(Behaviour::Fast, vec![post(1, 1, 10)]).await;
        let config = ClientConfig {
            hedge_percentile: hedge.then_some(80.0),
            // Calls run one at a time and one in 16 waits 600 ms, so a 1 s window holds only
            // a few dozen samples on a loaded machine: ask for few, or hedging may stay off.
            hedge_min_samples: 5,
            hedge_ratio: 0.5,
            hedge_window: Duration::from_secs(1),
            ..ClientConfig::default()
        };
        let client = ThunderClient::replicas(&[a.addr.to_string(), b.addr.to_string()], &config)
            .expect("client");
        // Warm-up fills tower's latency histogram, which is read one window after it is
        // written: two whole windows, so every window read while measuring has samples.
        let warm_up = Instant::now();
        while warm_up.elapsed() < Duration::from_millis(2200) {
            slowest_of(&client, 10, Duration::from_secs(3)).await;
        }
        let slowest = slowest_of(&client, 120, Duration::from_secs(3)).await;
        (slowest, a.calls() + b.calls())
    };
    let (without, _) = run(false).await;
    let (with, calls) = run(true).await;
    // Control: about 1 in 16 calls lands on a slow one; without hedging some call waits.
    assert!(
        without >= delay,
        "without hedging the slowest call took {without:?}"
    );
    assert!(
        with < delay / 2,
        "with hedging the slowest call took {with:?} ({calls} server calls)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balancer_sends_fewer_calls_to_a_loaded_replica() {
    let slow = Replica::start(Behaviour::Slow(Duration::from_millis(30)), vec![]).await;
    let fast = Replica::start(Behaviour::Fast, vec![]).await;
    let client = Arc::new(
        ThunderClient::replicas(
            &[slow.addr.to_string(), fast.addr.to_string()],
            &no_hedging(),
        )
        .expect("client"),
    );
    let mut callers = Vec::new();
    for _ in 0..8 {
        let client = Arc::clone(&client);
        callers.push(tokio::spawn(async move {
            for _ in 0..25 {
                let answer = client
                    .get_in_network_posts(request(), Duration::from_secs(3))
                    .await;
                assert!(answer.complete, "{:?}", answer.errors);
            }
        }));
    }
    for caller in callers {
        caller.await.expect("caller");
    }
    let (to_slow, to_fast) = (slow.calls(), fast.calls());
    assert_eq!(to_slow + to_fast, 200);
    // Random choice would split about evenly; power of two choices over calls in flight
    // avoids the replica where they pile up.
    assert!(
        to_fast >= 3 * to_slow,
        "slow replica got {to_slow}, fast one {to_fast}"
    );
    assert_eq!(client.replica_answers(0), vec![to_slow, to_fast]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_shorter_than_the_call_returns_on_time_and_is_sent_as_grpc_timeout() {
    let slow = Replica::start(
        Behaviour::Slow(Duration::from_secs(3)),
        vec![post(1, 1, 10)],
    )
    .await;
    let client = ThunderClient::replicas(&[slow.addr.to_string()], &no_hedging()).expect("client");
    let start = Instant::now();
    let answer = client
        .get_in_network_posts(request(), Duration::from_millis(150))
        .await;
    let took = start.elapsed();
    assert!(took < Duration::from_millis(600), "returned after {took:?}");
    assert!(!answer.complete);
    assert!(answer.posts.is_empty());
    assert_eq!(answer.errors.len(), 1);
    assert_eq!(answer.errors[0].code, Code::DeadlineExceeded);
    assert_eq!(answer.errors[0].attempts, 1, "deadlines are not retried");
    let err = answer.clone().into_result().expect_err("incomplete");
    assert_eq!(err.errors, answer.errors);

    let seen = slow.timeouts_seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    let header = seen[0].clone().expect("grpc-timeout sent");
    // tonic writes the budget in the largest unit that keeps it exact (e.g. "149998u").
    let (value, unit) = header.split_at(header.len() - 1);
    let value: u64 = value.parse().expect("number");
    let micros = match unit {
        "n" => value / 1000,
        "u" => value,
        "m" => value * 1000,
        "S" => value * 1_000_000,
        other => panic!("unit {other}"),
    };
    assert!(
        (100_000..=150_000).contains(&micros),
        "grpc-timeout {header}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_replicas_are_retried_elsewhere_and_then_left_out() {
    let live = Replica::start(Behaviour::Fast, vec![post(7, 1, 10)]).await;
    let dead = dead_address().await;
    let client = ThunderClient::replicas(&[dead.clone(), live.addr.to_string()], &no_hedging())
        .expect("client");
    for _ in 0..40 {
        let answer = client
            .get_in_network_posts(request(), Duration::from_secs(2))
            .await;
        assert!(answer.complete, "{:?}", answer.errors);
        assert_eq!(answer.posts, vec![post(7, 1, 10)]);
    }
    assert_eq!(live.calls(), 40);
    let tried_dead = client.replica_answers(0)[0];
    // After the first refusal the dead replica is left out for a second.
    assert!(
        (1..=3).contains(&tried_dead),
        "dead replica tried {tried_dead} times"
    );

    // Nothing listens at all: the call ends with UNAVAILABLE, within the budget.
    let all_dead = ThunderClient::replicas(&[dead], &no_hedging()).expect("client");
    let start = Instant::now();
    let answer = all_dead
        .get_in_network_posts(request(), Duration::from_millis(500))
        .await;
    assert!(start.elapsed() < Duration::from_millis(900));
    assert!(!answer.complete && answer.posts.is_empty());
    // UNAVAILABLE, or DEADLINE_EXCEEDED when the deadline caught a retry in flight.
    assert!(
        matches!(
            answer.errors[0].code,
            Code::Unavailable | Code::DeadlineExceeded
        ),
        "{:?}",
        answer.errors
    );
    assert!(answer.errors[0].attempts >= 2, "{:?}", answer.errors);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_errors_are_not_retried() {
    let failing = Replica::start(Behaviour::Fails(Code::InvalidArgument), vec![]).await;
    let client =
        ThunderClient::replicas(&[failing.addr.to_string()], &no_hedging()).expect("client");
    let answer = client
        .get_in_network_posts(request(), Duration::from_secs(2))
        .await;
    assert_eq!(answer.errors.len(), 1);
    assert_eq!(answer.errors[0].code, Code::InvalidArgument);
    assert_eq!(answer.errors[0].attempts, 1);
    assert_eq!(failing.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_budget_caps_retries() {
    let failing = Replica::start(Behaviour::Fails(Code::Unavailable), vec![]).await;
    let config = ClientConfig {
        retry_ratio: 0.0,
        retry_reserve_per_sec: 1,
        budget_window: Duration::from_secs(1),
        ..no_hedging()
    };
    let client = ThunderClient::replicas(&[failing.addr.to_string()], &config).expect("client");
    let mut attempts = 0;
    for _ in 0..20 {
        let answer = client
            .get_in_network_posts(request(), Duration::from_secs(2))
            .await;
        assert!(!answer.complete);
        attempts += answer.errors[0].attempts;
    }
    // 20 calls; a reserve of one retry per second allows at most a couple of retries.
    assert!((20..=23).contains(&attempts), "{attempts} attempts");
    assert_eq!(failing.calls(), u64::from(attempts));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_are_merged_newest_first_and_a_failed_shard_fails_open() {
    use thunder_proto::shard::shard_of;
    // Authors on shard 0 and shard 1 of 2.
    let on = |s: u32| (1..).find(|&a| shard_of(a, 2) == s).unwrap_or(0);
    let (a0, a1) = (on(0), on(1));
    let zero = Replica::start(
        Behaviour::Fast,
        vec![post(1, a0, 50), post(2, a0, 30), post(3, a0, 10)],
    )
    .await;
    let one = Replica::start(Behaviour::Fast, vec![post(4, a1, 40), post(5, a1, 20)]).await;
    let mut req = request();
    req.following_user_ids = vec![a0 as u64, a1 as u64];
    req.max_results = 4;
    let groups = vec![vec![zero.addr.to_string()], vec![one.addr.to_string()]];
    let client = ThunderClient::sharded(&groups, &no_hedging()).expect("client");
    let answer = client
        .get_in_network_posts(req.clone(), Duration::from_secs(2))
        .await;
    let ids: Vec<i64> = answer.posts.iter().map(|p| p.post_id).collect();
    assert_eq!(ids, [1, 4, 2, 5]);
    assert!(answer.complete);

    // Shard 1 gone: shard 0's posts, marked incomplete, within the deadline.
    let dead = dead_address().await;
    let groups = vec![vec![zero.addr.to_string()], vec![dead]];
    let client = ThunderClient::sharded(&groups, &no_hedging()).expect("client");
    let start = Instant::now();
    let answer: FeedAnswer = client
        .get_in_network_posts(req, Duration::from_millis(300))
        .await;
    assert!(start.elapsed() < Duration::from_millis(700));
    let ids: Vec<i64> = answer.posts.iter().map(|p| p.post_id).collect();
    assert_eq!(ids, [1, 2, 3]);
    assert!(!answer.complete);
    assert_eq!(answer.errors.len(), 1);
    assert_eq!(answer.errors[0].shard, 1);
}

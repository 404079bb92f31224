//! `PostStore` against `ModelStore`: the same operations on both, one shared `ManualClock`,
//! every answer compared with `answers_agree` and checked against the [`History`] invariants.
//! The threaded target also replays every round into a second `PostStore` in another order and
//! checks that both engines converge (`BEHAVIOUR.md`, "Convergence").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use thunder_engine::config::TRIM_FRACTION;
use thunder_engine::{
    Clock, DeleteEvent, DeleteReport, DropReason, InsertReport, LightPost, ManualClock, OwnedQuery,
    PostStore, QueryOutcome, Store, StoreConfig, TrimReport,
};
use thunder_testkit::model::{ModelStore, answers_agree};

use crate::invariants::{History, Seq};
use crate::ops::{
    BetweenOp, MAX_BATCH, MAX_OPS, Op, Ownership, Rounds, START_SECS, Sequence, Setup, WriterOp,
    audit_query,
};

/// The engine, the model and the clock they share.
pub struct Pair {
    /// The shared clock.
    pub clock: Arc<ManualClock>,
    /// The store under test (shared with the writer threads of `run_rounds`).
    pub engine: Arc<PostStore>,
    /// The plain model.
    pub model: ModelStore,
    /// What was written, for the invariants.
    pub history: History,
    retention_secs: i64,
    cap: usize,
}

impl Pair {
    /// Both stores, empty, with the setup's retention and timeline cap.
    pub fn new(setup: &Setup) -> Self {
        let clock = Arc::new(ManualClock::new(START_SECS));
        let config = || StoreConfig {
            retention_secs: setup.retention_secs(),
            max_posting_list_size: setup.max_posting_list_size(),
            clock: clock.clone(),
        };
        Self {
            engine: Arc::new(PostStore::with_config(config())),
            model: ModelStore::with_config(config()),
            clock,
            history: History::default(),
            retention_secs: setup.retention_secs(),
            cap: setup.max_posting_list_size(),
        }
    }

    fn now(&self) -> i64 {
        self.clock.now_secs()
    }

    /// Inserts `batch` into both stores; the reports and the drops must be equal.
    pub fn insert(&mut self, seq: Seq, batch: &[LightPost]) {
        self.history.offer(seq, batch);
        let engine = insert(&self.engine, batch);
        self.model_insert(seq, batch, engine);
    }

    fn model_insert(&mut self, seq: Seq, batch: &[LightPost], engine: Inserted) {
        let mut drops = Vec::new();
        let model = self
            .model
            .insert_posts_with(batch, |i, why| drops.push((i, why)));
        assert_eq!(
            engine,
            (model, drops),
            "{seq:?}: insert reports or drops differ (engine, model) for {batch:?}"
        );
        assert_eq!(
            model.inserted + model.dropped(),
            batch.len(),
            "{seq:?}: every post is counted once"
        );
    }

    /// Deletes `events` from both stores; the numbers of posts removed must be equal.
    pub fn delete(&mut self, seq: Seq, events: &[DeleteEvent]) {
        let engine = self.engine.mark_as_deleted(events);
        self.model_delete(seq, events, engine);
    }

    fn model_delete(&mut self, seq: Seq, events: &[DeleteEvent], engine: DeleteReport) {
        let model = self.model.mark_as_deleted(events);
        assert_eq!(
            engine.removed, model.removed,
            "{seq:?}: posts removed differ (engine, model) for {events:?}"
        );
        for event in events {
            self.history.delete(seq, event.post_id);
        }
    }

    /// Writes the engine as a base file and replaces it by a fresh engine (same setup and
    /// clock) loaded from it, the file checked whole: the model, which saw every operation,
    /// must go on agreeing with it.
    pub fn rebase(&mut self, setup: &Setup) {
        let mut bytes = Vec::new();
        self.engine
            .write_base(&Default::default(), &mut bytes)
            .expect("a base is written");
        let loaded = PostStore::with_config(StoreConfig {
            retention_secs: setup.retention_secs(),
            max_posting_list_size: setup.max_posting_list_size(),
            clock: self.clock.clone(),
        });
        loaded.load_base_bytes(&bytes, 2).expect("a base loads");
        loaded.check_base(2).expect("a written base checks");
        self.engine = Arc::new(loaded);
        // The restarted store's load left out its expired tombstones and waiting reposts,
        // which the model would drop (and count) at its next trim instead.
        self.model.forget_expired_as_a_load_does();
    }

    /// Moves the clock by `secs`.
    pub fn advance(&mut self, secs: i64) {
        self.clock.advance(secs);
    }

    /// Trims one shard of both stores; the reports must be equal. Returns the report.
    pub fn trim(&mut self, seq: Seq, shard: usize) -> TrimReport {
        let engine = self.engine.trim(shard);
        let model = self.model.trim(shard);
        assert_eq!(
            engine, model,
            "{seq:?}: trim({shard}) reports differ (engine, model)"
        );
        engine
    }

    /// Runs `query` on both stores: the answers must agree and satisfy the invariants.
    /// With a passed deadline only the invariants are checked.
    pub fn query(&self, seq: Seq, query: &OwnedQuery) {
        let engine = self.engine.answer(query);
        self.check(seq, query, &engine);
        if query.deadline.is_some() {
            return;
        }
        assert!(!engine.timed_out, "{seq:?}: timed out without a deadline");
        let model = self.model.answer(query);
        if let Err(why) = answers_agree(&engine.posts, &model.posts, query.max_results) {
            panic!(
                "{seq:?}: engine and model disagree at {} ({why})\n query:  {query:?}\n \
                 engine: {:?}\n model:  {:?}",
                self.now(),
                ids(&engine.posts),
                ids(&model.posts)
            );
        }
        assert_eq!(
            engine.eligible, model.eligible,
            "{seq:?}: eligible differs (engine, model) for {query:?}"
        );
    }

    /// Checks an engine answer against the invariants.
    pub fn check(&self, seq: Seq, query: &OwnedQuery, outcome: &QueryOutcome) {
        check(
            &self.history,
            seq,
            query,
            outcome,
            self.now(),
            self.retention_secs,
            self.cap,
        );
    }

    /// The audit queries (every author, videos and not) on both stores.
    pub fn audit(&self, seq: Seq) {
        self.query(seq, &audit_query(false));
        self.query(seq, &audit_query(true));
    }
}

fn check(
    history: &History,
    seq: Seq,
    query: &OwnedQuery,
    outcome: &QueryOutcome,
    now: i64,
    retention_secs: i64,
    cap: usize,
) {
    if let Err(why) = history.check(query, &outcome.posts, now, retention_secs, cap) {
        panic!(
            "{seq:?}: broken invariant at {now}: {why}\n query:  {query:?}\n answer: {:?}",
            ids(&outcome.posts)
        );
    }
}

/// An insert report with the drops `insert_posts_with` reported, in call order.
type Inserted = (InsertReport, Vec<(usize, DropReason)>);

fn insert(store: &PostStore, batch: &[LightPost]) -> Inserted {
    let mut drops = Vec::new();
    let report = store.insert_posts_with(batch, |i, why| drops.push((i, why)));
    (report, drops)
}

fn ids(posts: &[LightPost]) -> Vec<(i64, i64)> {
    posts.iter().map(|p| (p.post_id, p.created_at)).collect()
}

fn trim_shard(raw: u8) -> usize {
    usize::from(raw) % TRIM_FRACTION
}

/// Runs `ingest_ordering`: each operation on both stores, then the audit queries.
pub fn run_sequence(input: &Sequence) {
    let mut pair = Pair::new(&input.setup);
    run_ops(&mut pair, &input.setup, &input.ops, 0, &mut Vec::new());
}

/// Applies `ops` (at most [`MAX_OPS`]) to both stores of `pair` as round `round`, each
/// followed by the audit queries. `offered`: the posts offered so far, which
/// [`Op::Duplicate`] sends again.
pub fn run_ops(
    pair: &mut Pair,
    setup: &Setup,
    ops: &[Op],
    round: usize,
    offered: &mut Vec<LightPost>,
) {
    let retention = setup.retention_secs();
    for (step, op) in ops.iter().take(MAX_OPS).enumerate() {
        let seq = (round, step);
        let now = pair.now();
        match op {
            Op::Create(specs) => {
                let batch: Vec<LightPost> = specs
                    .iter()
                    .take(MAX_BATCH)
                    .map(|s| s.build(now, retention, Ownership::All))
                    .collect();
                pair.insert(seq, &batch);
                offered.extend(batch);
            }
            Op::Duplicate { pick, created } => {
                if offered.is_empty() {
                    continue;
                }
                let mut post = offered[usize::from(*pick) % offered.len()];
                if let Some(when) = created {
                    post.created_at = when.resolve(now, retention);
                }
                pair.insert(seq, &[post]);
                offered.push(post);
            }
            Op::Delete(specs) => {
                let events: Vec<DeleteEvent> = specs
                    .iter()
                    .take(MAX_BATCH)
                    .map(|s| s.build(now, retention, Ownership::All))
                    .collect();
                pair.delete(seq, &events);
            }
            Op::Advance(advance) => pair.advance(advance.secs(retention)),
            Op::Trim(shard) => {
                pair.trim(seq, trim_shard(*shard));
            }
            Op::Query(spec) => pair.query(seq, &spec.build()),
            Op::Rebase => pair.rebase(setup),
        }
        pair.audit(seq);
    }
}

/// What one writer thread did in one round, in order.
enum Written {
    Insert(Vec<LightPost>, Inserted),
    Delete(Vec<DeleteEvent>, DeleteReport),
}

/// A second engine that gets every round's writes applied sequentially in another order than
/// the model's (writer 1's batches first, or the two writers' batches alternating), plus the
/// same trims. The writers' operations commute (disjoint ids and authors), so it must report
/// and answer exactly like the engine the writers ran on concurrently.
struct Replay {
    store: PostStore,
}

impl Replay {
    fn new(setup: &crate::ops::Setup, clock: Arc<ManualClock>) -> Self {
        Self {
            store: PostStore::with_config(StoreConfig {
                retention_secs: setup.retention_secs(),
                max_posting_list_size: setup.max_posting_list_size(),
                clock,
            }),
        }
    }

    /// Applies one round's writes in the order `round` selects and checks each report against
    /// the concurrent run's.
    fn apply(&self, round: usize, by_writer: &[Vec<Written>; 2]) {
        let order: Vec<(usize, usize)> = if round.is_multiple_of(2) {
            // Writer 1's batches, then writer 0's.
            (0..by_writer[1].len())
                .map(|i| (1, i))
                .chain((0..by_writer[0].len()).map(|i| (0, i)))
                .collect()
        } else {
            // Alternating, writer 1 first.
            let longest = by_writer[0].len().max(by_writer[1].len());
            (0..longest)
                .flat_map(|i| [(1, i), (0, i)])
                .filter(|&(w, i)| i < by_writer[w].len())
                .collect()
        };
        for (writer, i) in order {
            match &by_writer[writer][i] {
                Written::Insert(posts, concurrent) => {
                    let replayed = insert(&self.store, posts);
                    assert_eq!(
                        &replayed, concurrent,
                        "round {round}, writer {writer}, batch {i}: the replay reports or drops \
                         differently (replay, concurrent) for {posts:?}"
                    );
                }
                Written::Delete(events, concurrent) => {
                    let replayed = self.store.mark_as_deleted(events);
                    assert_eq!(
                        &replayed, concurrent,
                        "round {round}, writer {writer}, batch {i}: the replay deletes \
                         differently (replay, concurrent) for {events:?}"
                    );
                }
            }
        }
    }

    /// The replay must answer `query` like the engine: same posts (up to ties at the cut),
    /// same `timed_out`, same `eligible`.
    fn converges(&self, seq: Seq, engine: &PostStore, query: &OwnedQuery) {
        if query.deadline.is_some() {
            return;
        }
        let concurrent = engine.answer(query);
        let replayed = self.store.answer(query);
        if let Err(why) = answers_agree(&concurrent.posts, &replayed.posts, query.max_results) {
            panic!(
                "{seq:?}: the concurrent engine and the replay disagree ({why})\n query: \
                 {query:?}\n concurrent: {:?}\n replay:     {:?}",
                ids(&concurrent.posts),
                ids(&replayed.posts)
            );
        }
        assert_eq!(
            (concurrent.timed_out, concurrent.eligible),
            (replayed.timed_out, replayed.eligible),
            "{seq:?}: timed_out or eligible differ (concurrent, replay) for {query:?}"
        );
    }

    fn audit(&self, seq: Seq, engine: &PostStore) {
        self.converges(seq, engine, &audit_query(false));
        self.converges(seq, engine, &audit_query(true));
    }
}

/// Runs `ingest_ordering_threads`.
///
/// Each round: two writer threads apply their operations to the engine concurrently while the
/// main thread queries it (invariants only); writer `t` only touches post ids, authors and
/// repost sources of parity `t`, so any interleaving is equivalent to writer 0's operations
/// followed by writer 1's, which is what the model then applies (the engine's reports must
/// match the model's, batch by batch). Between rounds, clock moves, trims and compared queries
/// run on both stores with the writers parked at a barrier.
pub fn run_rounds(input: &Rounds) {
    let mut pair = Pair::new(&input.setup);
    let replay = Replay::new(&input.setup, Arc::clone(&pair.clock));
    let retention = input.setup.retention_secs();
    let rounds = &input.rounds[..input.rounds.len().min(MAX_OPS / 4)];
    // Main thread and both writers meet at three barriers per round: start, end, verdict.
    let barrier = Barrier::new(3);
    let stop = AtomicBool::new(false);
    let engine = Arc::clone(&pair.engine);
    let engine = &*engine;
    // The batches each writer builds at the start of every round (the clock is still then).
    let build = |owner: Ownership, ops: &[WriterOp], now: i64| -> Vec<WriterBatch> {
        ops.iter()
            .take(MAX_BATCH)
            .map(|op| match op {
                WriterOp::Create(specs) => WriterBatch::Insert(
                    specs
                        .iter()
                        .take(MAX_BATCH)
                        .map(|s| s.build(now, retention, owner))
                        .collect(),
                ),
                WriterOp::Delete(specs) => WriterBatch::Delete(
                    specs
                        .iter()
                        .take(MAX_BATCH)
                        .map(|s| s.build(now, retention, owner))
                        .collect(),
                ),
            })
            .collect()
    };

    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Vec<Written>)>();
        for writer in 0..2usize {
            let tx = tx.clone();
            let (barrier, stop, build) = (&barrier, &stop, &build);
            scope.spawn(move || {
                let owner = Ownership::Parity(writer as i64);
                for round in rounds {
                    barrier.wait();
                    let now = engine.now_secs();
                    let mut written = Vec::new();
                    for batch in build(owner, &round.writers[writer], now) {
                        written.push(match batch {
                            WriterBatch::Insert(posts) => {
                                let report = insert(engine, &posts);
                                Written::Insert(posts, report)
                            }
                            WriterBatch::Delete(events) => {
                                let report = engine.mark_as_deleted(&events);
                                Written::Delete(events, report)
                            }
                        });
                    }
                    // The receiver outlives the writers (it is dropped after the scope).
                    let _ = tx.send((writer, written));
                    barrier.wait();
                    barrier.wait();
                    // Acquire: pairs with the Release store before the verdict barrier.
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                }
            });
        }
        drop(tx);

        let mut failure = None;
        for (r, round) in rounds.iter().enumerate() {
            let now = pair.clock.now_secs();
            // Offer this round's creates first: a concurrent reader may see them at any time.
            for (writer, ops) in round.writers.iter().enumerate() {
                for (i, batch) in build(Ownership::Parity(writer as i64), ops, now)
                    .iter()
                    .enumerate()
                {
                    if let WriterBatch::Insert(posts) = batch {
                        pair.history.offer((r, i), posts);
                    }
                }
            }
            barrier.wait();
            let reads = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for spec in round.concurrent_reads.iter().take(4) {
                    let query = spec.build();
                    let outcome = engine.answer(&query);
                    pair.check((r, 0), &query, &outcome);
                }
            }));
            barrier.wait();
            let result = reads.and_then(|()| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut by_writer: [Vec<Written>; 2] = [Vec::new(), Vec::new()];
                    for _ in 0..2 {
                        let (writer, written) = rx.recv().expect("both writers report every round");
                        by_writer[writer] = written;
                    }
                    // The replay applies them in another order; the model applies writer 0's
                    // round, then writer 1's.
                    replay.apply(r, &by_writer);
                    for written in by_writer {
                        for (i, w) in written.into_iter().enumerate() {
                            match w {
                                Written::Insert(posts, report) => {
                                    pair.model_insert((r, i), &posts, report)
                                }
                                Written::Delete(events, report) => {
                                    pair.model_delete((r, i), &events, report)
                                }
                            }
                        }
                    }
                    pair.audit((r, usize::MAX));
                    replay.audit((r, usize::MAX), engine);
                    for (i, op) in round.between.iter().take(MAX_BATCH).enumerate() {
                        let seq = (r, MAX_BATCH + i);
                        match op {
                            BetweenOp::Advance(advance) => pair.advance(advance.secs(retention)),
                            BetweenOp::Trim(shard) => {
                                let concurrent = pair.trim(seq, trim_shard(*shard));
                                let replayed = replay.store.trim(trim_shard(*shard));
                                assert_eq!(
                                    concurrent, replayed,
                                    "{seq:?}: trim reports differ (engine, replay)"
                                );
                            }
                            BetweenOp::Query(spec) => {
                                let query = spec.build();
                                pair.query(seq, &query);
                                replay.converges(seq, engine, &query);
                            }
                        }
                        pair.audit(seq);
                        replay.audit(seq, engine);
                    }
                }))
            });
            if let Err(panic) = result {
                failure = Some(panic);
                // Release: pairs with the writers' Acquire load after the verdict barrier.
                stop.store(true, Ordering::Release);
            }
            barrier.wait();
            if failure.is_some() {
                break;
            }
        }
        if let Some(panic) = failure {
            std::panic::resume_unwind(panic);
        }
    });
}

/// A batch a writer applies.
enum WriterBatch {
    Insert(Vec<LightPost>),
    Delete(Vec<DeleteEvent>),
}

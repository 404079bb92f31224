//! Overload control of the query path: bounded work, degrade before reject.
//!
//! - **Executors**: at most [`OverloadConfig::executors`] store queries run at once (default:
//!   one per core, so one per runtime worker: queries are CPU-bound, more at once only adds
//!   latency). The others wait in a FIFO queue ([`tokio::sync::Semaphore`]). With every worker
//!   inside a query, calls also wait in the runtime's run queue before their handler runs;
//!   that wait counts too, since a call's clock starts when its stream is accepted
//!   (`arrival.rs`). (Before the stamp the default kept one core out of the queries, as
//!   the run-queue wait was unseen: light calls waited 70-560 ms and nothing was refused.)
//! - **Adaptive queue limit**: a call is refused at once (`RESOURCE_EXHAUSTED`) when the
//!   queue's expected wait, `waiting x mean service time / executors` (service time: an
//!   exponentially weighted mean of measured query times), exceeds
//!   [`OverloadConfig::max_queue_wait`] or what is left of the call's deadline, or when
//!   [`OverloadConfig::max_queued`] calls already wait. The limit follows the measured cost,
//!   so admitted work finishes in time and goodput stays near capacity under any offered load.
//! - **Degrade ladder** (CoDel-style, on queue wait, only on evidence of our own queue): a call
//!   counts as *queued* when it waited longer than [`OverloadConfig::target_wait`] **and** every
//!   executor was busy with other calls at some moment of its wait. A wait during which an
//!   executor stayed free is scheduler delay (a neighbour's CPU, a late wake-up of a lone
//!   call), not a queue that cheaper answers would shorten. Every [`OverloadConfig::interval`]
//!   the calls are judged: at least [`MIN_CALLS_PER_INTERVAL`] calls, most of them queued, is a
//!   standing queue and steps the level up at once; [`CLEAN_INTERVALS_TO_STEP_DOWN`] clean
//!   intervals step it down by one. An interval whose calls are mostly queued but too few to
//!   tell (slow queries) is extended, up to [`MIN_CALLS_PER_INTERVAL`] intervals, to collect
//!   them. A call runs at the level current when it leaves the queue: cheaper answers drain
//!   the queue faster, and refusals come only once even degraded answers cannot keep up.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Clean intervals (no standing queue) before the degrade level steps down by one.
pub const CLEAN_INTERVALS_TO_STEP_DOWN: u32 = 3;
/// Calls an interval needs before it can show a standing queue: one or two queued calls may
/// be a coincidence (two callers meeting once), not a queue.
pub const MIN_CALLS_PER_INTERVAL: u32 = 4;
/// Highest degrade level (see [`DegradeLevel`]).
pub const MAX_DEGRADE_LEVEL: u8 = 3;
/// Service time assumed before the first query is measured.
const INITIAL_SERVICE_NANOS: u64 = 500_000;

/// Settings of [`Overload`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverloadConfig {
    /// Store queries running at once.
    pub executors: usize,
    /// Calls are refused when the queue's expected wait exceeds this.
    pub max_queue_wait: Duration,
    /// Calls are refused when this many already wait.
    pub max_queued: usize,
    /// Queue wait behind busy executors that counts towards a standing queue (the CoDel
    /// target).
    pub target_wait: Duration,
    /// Length of one controller interval.
    pub interval: Duration,
    /// Highest degrade level used (0 turns degrading off; at most [`MAX_DEGRADE_LEVEL`]).
    pub max_level: u8,
}

impl Default for OverloadConfig {
    /// One executor per core, refuse beyond 50 ms of expected queue
    /// wait or 1024 waiting calls, degrade on a standing queue of 5 ms over 100 ms intervals,
    /// up to level 3.
    fn default() -> Self {
        Self {
            executors: one_per_core(),
            max_queue_wait: Duration::from_millis(50),
            max_queued: 1024,
            target_wait: Duration::from_millis(5),
            interval: Duration::from_millis(100),
            max_level: MAX_DEGRADE_LEVEL,
        }
    }
}

/// One per core: the default number of query executors.
pub fn one_per_core() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// How much cheaper a call is answered (0: not at all). Applied to a request by
/// `ValidatedRequest::degrade`:
/// 1: `max_results` halved; 2: quartered and per-author limits halved; 3: an eighth, per-author
/// limits quartered and only the first [`DEGRADED_MAX_AUTHORS`] authors read.
pub type DegradeLevel = u8;

/// Authors read at degrade level 3.
pub const DEGRADED_MAX_AUTHORS: usize = 500;

/// Why a call was not given an executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The queue is too long for the call to be served in time.
    Overloaded,
}

/// The shared controller (one per server).
#[derive(Debug)]
pub struct Overload {
    config: OverloadConfig,
    executors: Arc<Semaphore>,
    waiting: AtomicUsize,
    level: AtomicU8,
    /// The last closed interval had a standing queue.
    standing: AtomicBool,
    service_nanos: AtomicU64,
    busy: Arc<BusyClock>,
    controller: Mutex<Controller>,
}

#[derive(Debug)]
struct Controller {
    interval_start: Instant,
    /// Calls seen in this interval, and how many of them were queued (waited longer than the
    /// target behind busy executors).
    calls: u32,
    queued: u32,
    clean: u32,
}

/// When every executor was last busy at once; kept up to date by each [`ExecutorPermit`].
#[derive(Debug)]
struct BusyClock {
    base: Instant,
    /// Nanoseconds after `base` at which the latest moment with every executor busy ended
    /// (0: none yet).
    all_busy_until_nanos: AtomicU64,
}

impl BusyClock {
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// True when every executor was busy at some moment after `since`.
    fn all_busy_since(&self, since: Instant) -> bool {
        self.all_busy_until_nanos.load(Ordering::Relaxed) > self.nanos(since)
    }
}

/// An executor held by a query. Dropping it frees the executor.
#[derive(Debug)]
pub struct ExecutorPermit {
    permit: OwnedSemaphorePermit,
    busy: Arc<BusyClock>,
}

impl Drop for ExecutorPermit {
    fn drop(&mut self) {
        // The permit is still held here (fields drop after this body): no free executor means
        // every executor was busy until now.
        if self.permit.semaphore().available_permits() == 0 {
            let now = self.busy.nanos(Instant::now());
            // Relaxed: a waiter given this executor is ordered after this store by the
            // semaphore's own synchronisation; other readers only need a recent value.
            self.busy
                .all_busy_until_nanos
                .fetch_max(now, Ordering::Relaxed);
        }
    }
}

/// An executor slot: the call may run its query. Dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    permit: ExecutorPermit,
    /// The degrade level to answer at.
    pub level: DegradeLevel,
    /// How long the call waited for the slot.
    pub queue_wait: Duration,
}

impl Slot {
    /// The permit, to move into the thread that runs the query (so the slot stays taken
    /// until the query really ends, even if the call is abandoned meanwhile).
    pub fn into_permit(self) -> ExecutorPermit {
        self.permit
    }
}

/// Leaves the waiting count when the wait ends, also when the call is dropped while waiting.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Overload {
    /// A controller with `config` (`executors` at least 1).
    pub fn new(mut config: OverloadConfig) -> Self {
        config.executors = config.executors.max(1);
        config.max_level = config.max_level.min(MAX_DEGRADE_LEVEL);
        Self {
            executors: Arc::new(Semaphore::new(config.executors)),
            waiting: AtomicUsize::new(0),
            level: AtomicU8::new(0),
            standing: AtomicBool::new(false),
            service_nanos: AtomicU64::new(INITIAL_SERVICE_NANOS),
            busy: Arc::new(BusyClock {
                base: Instant::now(),
                all_busy_until_nanos: AtomicU64::new(0),
            }),
            controller: Mutex::new(Controller {
                interval_start: Instant::now(),
                calls: 0,
                queued: 0,
                clean: 0,
            }),
            config,
        }
    }

    /// The settings.
    pub fn config(&self) -> &OverloadConfig {
        &self.config
    }

    /// The current degrade level.
    pub fn level(&self) -> DegradeLevel {
        self.level.load(Ordering::Relaxed)
    }

    /// Calls waiting for an executor now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The queue's expected wait for a call arriving now.
    pub fn expected_wait(&self) -> Duration {
        let waiting = self.waiting() as u64;
        let nanos = waiting.saturating_mul(self.service_nanos.load(Ordering::Relaxed))
            / self.config.executors as u64;
        Duration::from_nanos(nanos)
    }

    /// Waits for an executor, or refuses at once when the call could not be served within
    /// the queue limit or before `deadline`. `accepted` is when the call's stream was accepted
    /// (`arrival.rs`): the wait before the handler ran (in the connection and the
    /// runtime's run queue) counts as queue wait. A call that already waited longer than
    /// [`OverloadConfig::max_queue_wait`] is refused while the ladder is at its top and the
    /// queue standing: with an executor per runtime worker and queries run inline, the run
    /// queue is where calls wait, and this is how it is kept short.
    pub async fn acquire(
        &self,
        accepted: Instant,
        deadline: Option<Instant>,
    ) -> Result<Slot, Refusal> {
        let arrived = Instant::now();
        let waited = arrived.saturating_duration_since(accepted);
        if waited > self.config.max_queue_wait && self.saturated() {
            // Counted as a wait: the controller stays at its top while calls wait this long.
            let behind_busy =
                self.executors.available_permits() == 0 || self.busy.all_busy_since(accepted);
            self.observe_wait(arrived, waited, behind_busy);
            return Err(Refusal::Overloaded);
        }
        // Fast path: a free executor and nobody waiting.
        if self.waiting() == 0
            && let Ok(permit) = Arc::clone(&self.executors).try_acquire_owned()
        {
            // Its wait (before the handler ran) was queued only if the executors were all
            // busy meanwhile: else it was scheduler delay.
            let level = self.observe_wait(arrived, waited, self.busy.all_busy_since(accepted));
            return Ok(Slot {
                permit: self.permit(permit),
                level,
                queue_wait: waited,
            });
        }
        let expected = self.expected_wait();
        let too_late = deadline.is_some_and(|d| arrived + expected >= d);
        if self.waiting() >= self.config.max_queued
            || expected > self.config.max_queue_wait
            || too_late
        {
            return Err(Refusal::Overloaded);
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(&self.waiting);
        let permit = Arc::clone(&self.executors)
            .acquire_owned()
            .await
            .map_err(|_| Refusal::Overloaded)?;
        drop(waiting);
        let now = Instant::now();
        let queue_wait = now.saturating_duration_since(accepted);
        let level = self.observe_wait(now, queue_wait, self.busy.all_busy_since(accepted));
        Ok(Slot {
            permit: self.permit(permit),
            level,
            queue_wait,
        })
    }

    fn permit(&self, permit: OwnedSemaphorePermit) -> ExecutorPermit {
        ExecutorPermit {
            permit,
            busy: Arc::clone(&self.busy),
        }
    }

    /// True when degrading cannot go further: the ladder (if any) is at its top and the last
    /// interval had a standing queue. Only then are calls refused for having waited long.
    fn saturated(&self) -> bool {
        self.config.max_level > 0
            && self.level() == self.config.max_level
            && self.standing.load(Ordering::Relaxed)
    }

    /// Feeds one measured query time into the service-time mean (weight 1/8).
    pub fn observe_service(&self, took: Duration) {
        let sample = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let old = self.service_nanos.load(Ordering::Relaxed);
        // A lost update between racing callers only drops one sample of a mean.
        let new = old - old / 8 + sample / 8;
        self.service_nanos.store(new.max(1), Ordering::Relaxed);
    }

    /// Records one queue wait (`behind_busy`: every executor was busy with other calls at some
    /// moment of it); closes the controller interval when it is over and returns the level to
    /// answer at.
    fn observe_wait(&self, now: Instant, wait: Duration, behind_busy: bool) -> DegradeLevel {
        if self.config.max_level == 0 {
            return 0;
        }
        let Ok(mut c) = self.controller.lock() else {
            return self.level();
        };
        c.calls = c.calls.saturating_add(1);
        if wait > self.config.target_wait && behind_busy {
            c.queued = c.queued.saturating_add(1);
        }
        let elapsed = now.saturating_duration_since(c.interval_start);
        if elapsed < self.config.interval {
            return self.level();
        }
        // Most calls, not every call (CoDel's minimum): with one runtime worker, a stream task
        // spawned by its connection often runs next (tokio's LIFO slot) and waits ~15 us while
        // the others wait tens of ms; the minimum then never shows the standing queue
        // (measured: 97% of calls over target, minimum 11-17 us, in every interval).
        let mostly_queued = u64::from(c.queued) * 2 > u64::from(c.calls);
        let enough_calls = c.calls >= MIN_CALLS_PER_INTERVAL;
        if mostly_queued
            && !enough_calls
            && elapsed < self.config.interval.saturating_mul(MIN_CALLS_PER_INTERVAL)
        {
            // Too few calls yet to tell a queue from a coincidence (slow queries leave few
            // calls per interval): keep collecting.
            return self.level();
        }
        let standing = mostly_queued && enough_calls;
        let mut level = self.level();
        c.calls = 0;
        c.queued = 0;
        // Whole intervals that passed without any call count as clean.
        let idle_intervals =
            (elapsed.as_nanos() / self.config.interval.as_nanos().max(1)).saturating_sub(1);
        if standing {
            level = (level + 1).min(self.config.max_level);
            c.clean = 0;
        } else {
            c.clean = c
                .clean
                .saturating_add(1)
                .saturating_add(u32::try_from(idle_intervals).unwrap_or(u32::MAX));
            while c.clean >= CLEAN_INTERVALS_TO_STEP_DOWN && level > 0 {
                level -= 1;
                c.clean -= CLEAN_INTERVALS_TO_STEP_DOWN;
            }
            if level == 0 {
                c.clean = 0;
            }
        }
        c.interval_start = now;
        self.standing.store(standing, Ordering::Relaxed);
        self.level.store(level, Ordering::Relaxed);
        level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> OverloadConfig {
        OverloadConfig {
            executors: 1,
            max_queue_wait: Duration::from_millis(50),
            max_queued: 4,
            target_wait: Duration::from_millis(5),
            interval: Duration::from_millis(100),
            max_level: MAX_DEGRADE_LEVEL,
        }
    }

    /// Feeds the calls of one interval: one per entry of `waits_ms`, each having waited so
    /// long, `behind_busy` or not. The last call, at `end_ms` after `start`, closes the
    /// interval (when it is long enough); the others come 50 ms before it. Returns the level
    /// the last call is answered at.
    fn interval(
        overload: &Overload,
        start: Instant,
        end_ms: u64,
        waits_ms: &[u64],
        behind_busy: bool,
    ) -> DegradeLevel {
        let mut level = overload.level();
        for (i, wait) in (0u64..).zip(waits_ms) {
            let at_ms = if i + 1 == waits_ms.len() as u64 {
                end_ms
            } else {
                end_ms - 50 + i
            };
            level = overload.observe_wait(
                start + Duration::from_millis(at_ms),
                Duration::from_millis(*wait),
                behind_busy,
            );
        }
        level
    }

    #[test]
    fn a_standing_queue_steps_up_at_once_and_clean_intervals_step_down() {
        let overload = Overload::new(config());
        let start = Instant::now();
        // Every call waited behind busy executors longer than the 5 ms target: one step up at
        // the end of each interval.
        assert_eq!(interval(&overload, start, 101, &[10; 4], true), 1);
        assert_eq!(interval(&overload, start, 202, &[20; 4], true), 2);
        assert_eq!(interval(&overload, start, 303, &[20; 4], true), 3);
        assert_eq!(interval(&overload, start, 404, &[20; 4], true), 3);
        // Most calls waited, one lucky call did not: still a standing queue (level stays 3).
        assert_eq!(interval(&overload, start, 505, &[0, 9, 9, 9], true), 3);
        // Half of the calls or fewer waited: clean; three clean intervals step down by one.
        assert_eq!(interval(&overload, start, 606, &[0, 0, 9, 9], true), 3);
        assert_eq!(interval(&overload, start, 707, &[0; 4], true), 3);
        assert_eq!(interval(&overload, start, 808, &[0; 4], true), 2);
        // A long idle gap counts as clean intervals.
        assert_eq!(interval(&overload, start, 1600, &[0], false), 0);
    }

    #[test]
    fn waits_with_an_executor_free_never_step_up() {
        let overload = Overload::new(config());
        let start = Instant::now();
        // Every call waited 50 ms (ten times the target), but never behind busy executors:
        // scheduler delay, however long and however many calls.
        for i in 1..=20u64 {
            assert_eq!(interval(&overload, start, 101 * i, &[50; 8], false), 0);
        }
    }

    #[test]
    fn too_few_calls_are_not_a_queue_until_more_show_it() {
        let overload = Overload::new(config());
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let queued = |ms: u64| overload.observe_wait(at(ms), Duration::from_millis(20), true);
        // One queued call per interval, and a clean one between them: never a standing queue.
        for i in 0..10u64 {
            assert_eq!(queued(101 + 200 * i), 0);
            assert_eq!(
                overload.observe_wait(at(201 + 200 * i), Duration::ZERO, false),
                0
            );
        }
        // Slow queries: one queued call per interval, and nothing else. The interval is
        // extended until it holds enough calls, then the queue shows.
        let overload = Overload::new(config());
        let queued = |ms: u64| overload.observe_wait(at(ms), Duration::from_millis(20), true);
        assert_eq!(queued(101), 0);
        assert_eq!(queued(202), 0);
        assert_eq!(queued(303), 0);
        assert_eq!(queued(404), 1);
        // An interval extended past its limit without enough calls is judged clean.
        let overload = Overload::new(config());
        let queued = |ms: u64| overload.observe_wait(at(ms), Duration::from_millis(20), true);
        assert_eq!(queued(101), 0);
        assert_eq!(queued(502), 0);
        assert_eq!(queued(603), 0);
    }

    /// A lone caller: one call at a time, each woken late (simulated: 8 ms, above the 5 ms
    /// target, between its acceptance and its handler), with every executor free. Before,
    /// each late call was a standing queue of its interval and stepped the ladder up.
    #[tokio::test]
    async fn a_lone_sequential_caller_woken_late_is_never_degraded() {
        let overload = Overload::new(OverloadConfig {
            interval: Duration::from_millis(10),
            ..config()
        });
        for _ in 0..40 {
            let accepted = Instant::now();
            std::thread::sleep(Duration::from_millis(8));
            let slot = overload.acquire(accepted, None).await.expect("served");
            assert!(slot.queue_wait > overload.config().target_wait);
            assert_eq!(slot.level, 0, "a lone caller degraded");
            drop(slot);
        }
        assert_eq!(overload.level(), 0);
    }

    /// Six callers in a closed loop on one executor, each holding it 3 ms: every call waits
    /// ~15 ms for the executor, a real standing queue, and the ladder steps up. Then one
    /// caller alone: clean intervals step it down to 0.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_real_queue_steps_up_and_clean_intervals_step_down() {
        let overload = Arc::new(Overload::new(OverloadConfig {
            interval: Duration::from_millis(20),
            max_queue_wait: Duration::from_secs(5),
            max_queued: 64,
            ..config()
        }));
        let until = Instant::now() + Duration::from_millis(500);
        let mut callers = Vec::new();
        for _ in 0..6 {
            let o = Arc::clone(&overload);
            callers.push(tokio::spawn(async move {
                let mut top = 0;
                while Instant::now() < until {
                    let slot = o.acquire(Instant::now(), None).await.expect("queued");
                    top = top.max(slot.level);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    drop(slot);
                }
                top
            }));
        }
        let mut top = 0;
        for c in callers {
            top = top.max(c.await.expect("joins"));
        }
        assert!(top >= 1, "a standing queue did not degrade");
        // Alone now: no wait, so every interval is clean and the level only goes down.
        let mut level = overload.level();
        for _ in 0..200 {
            if level == 0 {
                break;
            }
            let slot = overload
                .acquire(Instant::now(), None)
                .await
                .expect("served");
            assert!(slot.level <= level, "stepped up without a queue");
            level = slot.level;
            drop(slot);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(level, 0, "clean intervals did not step down");
    }

    #[test]
    fn degrading_can_be_turned_off() {
        let overload = Overload::new(OverloadConfig {
            max_level: 0,
            ..config()
        });
        let start = Instant::now();
        for i in 1..10 {
            let level = overload.observe_wait(
                start + Duration::from_millis(i * 150),
                Duration::from_secs(1),
                true,
            );
            assert_eq!(level, 0);
        }
    }

    #[tokio::test]
    async fn refuses_when_the_expected_wait_is_too_long() {
        let overload = Arc::new(Overload::new(config()));
        // Each query is measured at 20 ms: 3 waiting calls -> 60 ms expected > 50 ms.
        for _ in 0..64 {
            overload.observe_service(Duration::from_millis(20));
        }
        let running = overload
            .acquire(Instant::now(), None)
            .await
            .expect("a free executor");
        let mut waiters = Vec::new();
        for _ in 0..3 {
            let o = Arc::clone(&overload);
            waiters.push(tokio::spawn(async move {
                o.acquire(Instant::now(), None).await.map(|_| ())
            }));
            while overload.waiting() < waiters.len() {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(overload.waiting(), 3);
        assert!(overload.expected_wait() > Duration::from_millis(50));
        assert_eq!(
            overload.acquire(Instant::now(), None).await.err(),
            Some(Refusal::Overloaded)
        );
        // A deadline the queue cannot meet is refused even when the queue is short.
        let soon = Some(Instant::now() + Duration::from_millis(1));
        assert_eq!(
            overload.acquire(Instant::now(), soon).await.err(),
            Some(Refusal::Overloaded)
        );
        drop(running);
        for w in waiters {
            assert_eq!(w.await.expect("joins"), Ok(()));
        }
        assert_eq!(overload.waiting(), 0);
    }

    #[tokio::test]
    async fn a_call_that_waited_long_before_running_is_refused_only_at_the_top_of_the_ladder() {
        let overload = Overload::new(config());
        let long_ago = Instant::now() - Duration::from_millis(60);
        // Idle controller: a call that spent 60 ms before its handler ran (a slow upload, a
        // busy runtime) is served, and its wait is what the controller records.
        let slot = overload.acquire(long_ago, None).await.expect("served");
        assert!(slot.queue_wait >= Duration::from_millis(60));
        drop(slot);
        // Standing queue for three intervals: the ladder reaches its top.
        let start = Instant::now();
        for i in 1..=4u64 {
            interval(&overload, start, 101 * i, &[20; 4], true);
        }
        assert_eq!(overload.level(), MAX_DEGRADE_LEVEL);
        assert_eq!(
            overload.acquire(long_ago, None).await.err(),
            Some(Refusal::Overloaded)
        );
        // A call that did not wait is still answered, at the top level.
        let slot = overload
            .acquire(Instant::now(), None)
            .await
            .expect("served");
        assert_eq!(slot.level, MAX_DEGRADE_LEVEL);
        drop(slot);
        // Without a ladder nothing is refused for its wait.
        let flat = Overload::new(OverloadConfig {
            max_level: 0,
            ..config()
        });
        for i in 1..=4u64 {
            interval(&flat, start, 101 * i, &[20; 4], true);
        }
        assert!(flat.acquire(long_ago, None).await.is_ok());
    }

    #[tokio::test]
    async fn an_abandoned_wait_leaves_the_queue() {
        let overload = Overload::new(config());
        let running = overload
            .acquire(Instant::now(), None)
            .await
            .expect("a free executor");
        let wait = tokio::time::timeout(
            Duration::from_millis(20),
            overload.acquire(Instant::now(), None),
        )
        .await;
        assert!(wait.is_err(), "no executor is free");
        assert_eq!(overload.waiting(), 0);
        drop(running);
        assert!(overload.acquire(Instant::now(), None).await.is_ok());
    }
}

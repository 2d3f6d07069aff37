//! How the host polls a future a plugin returned: when the plugin's
//! future wakes itself during a poll and returns `Pending`, the host polls
//! it again at once, a bounded number of times, instead of sending the
//! task back through tokio's scheduler.
//!
//! Why: a plugin future that yields (a synchronous hook made into a
//! future, a loop that hands control back between steps) wakes its own
//! waker and returns `Pending`. Through tokio that wake is a reschedule:
//! the task goes to the back of the worker's run queue and a parked worker
//! is notified (an `eventfd` write), which on a 2-core machine then steals
//! the task, so the plugin's next step runs on another core with cold
//! caches. Measured with the `faces` bench (BENCHMARKS.md): one blocking
//! `get` per poll cost ~3× a `get` made inside one poll, most of the
//! difference in that round trip.
//!
//! What stays as it was:
//!
//! - **Every poll is a real poll** of the plugin's future, with a waker;
//!   only the round trip through the scheduler between two of them is
//!   skipped, and only when the wake came while the host was polling.
//! - **Fairness.** Each immediate re-poll spends one unit of the task's
//!   tokio coop budget ([`tokio::task::coop::poll_proceed`]); once it is
//!   spent, or after [`REPOLL_BUDGET`] re-polls in one poll of the task
//!   (outside a runtime there is no coop budget), the host passes the wake
//!   to the task's waker and returns `Pending`: a plugin future that wakes
//!   itself forever yields to the runtime like any other busy task.
//! - **Wakes from elsewhere.** The plugin sees a waker of the host's
//!   ([`SelfWake`]) that records a wake arriving during a poll (that poll is
//!   then followed by another, which sees what the wake announced) and
//!   passes every other wake, from any thread, at any later time, to the
//!   task's current waker.
//! - **No allocation per poll.** A future that is done in its first poll
//!   (most hooks) is polled with the task's own waker and allocates
//!   nothing; one that is not gets its [`SelfWake`] once, kept for the
//!   rest of its life and updated when the task's waker changes.

use std::{
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll, Wake, Waker},
};

use crate::util::LockExt;

/// At most this many immediate re-polls per poll of the task, on top of
/// tokio's coop budget (128 units per task poll, one spent per re-poll):
/// the bound where tokio's budget does not apply (outside a runtime), and
/// the most a self-waking plugin future delays the worker's other tasks,
/// ~32 plugin steps. Enough that the scheduler's round trip is paid about
/// once per 33 steps instead of once per step.
pub(in crate::plugin) const REPOLL_BUDGET: u32 = 32;

/// Not inside a poll of the plugin's future: wakes go to the task.
const IDLE: u8 = 0;
/// Inside a poll, not woken yet.
const POLLING: u8 = 1;
/// Inside a poll and woken: the poller will poll again or pass it on.
const POLLING_WOKEN: u8 = 2;

/// The waker a plugin's future sees after its first poll.
#[derive(Debug)]
struct SelfWake {
    state: AtomicU8,
    /// The waker of the task awaiting the plugin's future, as of its last
    /// poll.
    task: Mutex<Waker>,
}

impl SelfWake {
    /// Makes sure a later wake reaches the task that polls now.
    fn register(&self, task: &Waker) {
        let mut current = self.task.lock_unpoisoned();
        if !current.will_wake(task) {
            current.clone_from(task);
        }
    }
}

impl Wake for SelfWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // During a poll the poller sees the mark after the poll returns
        // (its `swap` below orders after this exchange); otherwise, or if
        // the poll has just ended, the task must hear it.
        match self.state.compare_exchange(
            POLLING,
            POLLING_WOKEN,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) | Err(POLLING_WOKEN) => {}
            Err(_) => self.task.lock_unpoisoned().wake_by_ref(),
        }
    }
}

/// Polls one plugin future for the host; see the module doc.
#[derive(Debug, Default)]
pub(in crate::plugin) struct Repoller {
    /// Created at the first poll that returned `Pending`; the waker is
    /// made from the `Arc` once.
    wake: Option<(Arc<SelfWake>, Waker)>,
}

impl Repoller {
    /// Polls through `poll` (a poll of the plugin's future), again at once
    /// while the future woke itself during the poll, within the budgets.
    pub(in crate::plugin) fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        // Switched off: every poll is one poll of the plugin's future with
        // the task's waker, and a self-wake goes through the scheduler.
        if crate::perf::off(crate::perf::Mechanism::Repoll) {
            return poll(cx);
        }
        let Some((shared, waker)) = &self.wake else {
            let first = poll(cx);
            if first.is_pending() {
                let shared = Arc::new(SelfWake {
                    state: AtomicU8::new(IDLE),
                    task: Mutex::new(cx.waker().clone()),
                });
                let waker = Waker::from(Arc::clone(&shared));
                self.wake = Some((shared, waker));
            }
            return first;
        };
        shared.register(cx.waker());
        let mut plugin_cx = Context::from_waker(waker);
        let mut repolls = 0;
        loop {
            shared.state.store(POLLING, Ordering::Release);
            let polled = poll(&mut plugin_cx);
            let woken = shared.state.swap(IDLE, Ordering::AcqRel) == POLLING_WOKEN;
            if polled.is_ready() || !woken {
                return polled;
            }
            if repolls == REPOLL_BUDGET {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            match tokio::task::coop::poll_proceed(cx) {
                Poll::Ready(spent) => spent.made_progress(),
                // The budget is spent; tokio has arranged the task's wake.
                Poll::Pending => return Poll::Pending,
            }
            repolls += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        future::Future,
        pin::Pin,
        sync::atomic::{AtomicUsize, Ordering},
        task::{Context, Poll},
        time::Duration,
    };

    use super::*;

    /// Wakes itself and returns `Pending` until `steps` polls have run;
    /// counts the polls.
    struct SelfWaking {
        polls: Arc<AtomicUsize>,
        steps: usize,
        repoller: Repoller,
    }

    impl Future for SelfWaking {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let this = &mut *self;
            let (polls, steps) = (&this.polls, this.steps);
            this.repoller.poll(cx, |cx| {
                if polls.fetch_add(1, Ordering::Relaxed) + 1 >= steps {
                    return Poll::Ready(());
                }
                cx.waker().wake_by_ref();
                Poll::Pending
            })
        }
    }

    /// Outside a runtime there is no coop budget: each poll of the outer
    /// future is the first poll plus at most `REPOLL_BUDGET + 1` polls.
    #[test]
    fn self_wakes_are_polled_again_within_the_budget() {
        let polls = Arc::new(AtomicUsize::new(0));
        let mut fut = SelfWaking {
            polls: Arc::clone(&polls),
            steps: usize::MAX,
            repoller: Repoller::default(),
        };
        let woken = Arc::new(CountingWaker::default());
        let waker = Waker::from(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 1, "first poll: once");
        assert_eq!(woken.count(), 1, "the first poll's wake reaches the task");
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        assert_eq!(
            polls.load(Ordering::Relaxed),
            2 + REPOLL_BUDGET as usize,
            "then one poll and REPOLL_BUDGET re-polls"
        );
        assert_eq!(
            woken.count(),
            2,
            "the wake past the budget reaches the task"
        );
    }

    /// A wake that comes after the poll, from another thread, reaches the
    /// task's waker.
    #[test]
    fn a_wake_after_the_poll_reaches_the_task() {
        let woken = Arc::new(CountingWaker::default());
        let waker = Waker::from(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        let mut repoller = Repoller::default();
        let mut stored = None;
        for _ in 0..2 {
            let poll: Poll<()> = repoller.poll(&mut cx, |cx| {
                stored = Some(cx.waker().clone());
                Poll::Pending
            });
            assert!(poll.is_pending());
        }
        assert_eq!(woken.count(), 0);
        let stored = stored.unwrap();
        std::thread::spawn(move || stored.wake()).join().unwrap();
        assert_eq!(woken.count(), 1);
    }

    /// On a runtime, tokio's coop budget bounds the re-polls too, and a
    /// future that wakes itself forever does not keep another task of a
    /// single-threaded runtime from running (if it did, the runtime's
    /// thread would never come back; the test gives up after a minute).
    #[test]
    fn a_future_that_wakes_itself_forever_yields_to_the_runtime() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            let polls = runtime.block_on(async {
                let polls = Arc::new(AtomicUsize::new(0));
                let spinning = tokio::spawn(SelfWaking {
                    polls: Arc::clone(&polls),
                    steps: usize::MAX,
                    repoller: Repoller::default(),
                });
                // Another task on the same thread, and a timer.
                tokio::spawn(tokio::time::sleep(Duration::from_millis(10)))
                    .await
                    .unwrap();
                spinning.abort();
                polls.load(Ordering::Relaxed)
            });
            let _ = done.send(polls);
        });
        let polls = finished
            .recv_timeout(Duration::from_secs(60))
            .expect("the other task never ran: the self-waking future held the thread");
        assert!(polls > 1, "the spinning future ran too ({polls} polls)");
    }

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl CountingWaker {
        fn count(&self) -> usize {
            self.0.load(Ordering::Relaxed)
        }
    }

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

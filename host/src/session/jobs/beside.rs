//! A thread kept for the work a large move can do beside the thread that
//! runs its write.
//!
//! A move of a thousand jobs builds a thousand caller results and
//! serialises two thousand events, 1.5–2 ms each, while its own thread is
//! busy in SQLite; the machine has another core. A thread started for
//! each move did not get that core in time: on this 2-core VM a new
//! thread waited 0.2–3.5 ms on its parent's core while the other one sat
//! idle (a `perf sched` trace, BENCHMARKS.md 2026-12-03 sixth round),
//! where a thread already started and woken from its wait runs on the
//! idle core at once. So one thread is started once per process and kept.
//!
//! Woken, even the kept thread did not always get the idle core: on this
//! VM's kernel a woken thread is often placed on its waker's core, where
//! it preempts the waker, and the two took turns on one core for the
//! whole move (3–4 ms at a stretch, the other core idle throughout: a
//! `sched_switch` trace, BENCHMARKS.md 2026-12-04 tenth round). So on
//! Linux each lend first moves the kept thread off the lender's core
//! ([`placement`]): the scheduler must then run it elsewhere.
//!
//! Nothing waits for it to start: each piece of work is [`Claim`]ed by
//! whichever thread gets to it first, so a busy or late kept thread costs
//! the move nothing but the work it does itself, and what the move
//! [`lend`]s it comes back whole (not copied) once that work is done.

use std::sync::{mpsc, Arc, Condvar, LazyLock, Mutex};

use crate::util::LockExt;

type Task = Box<dyn FnOnce() + Send>;

/// The kept thread's queue; `None` if the thread could not start.
static QUEUE: LazyLock<Option<Mutex<mpsc::Sender<Task>>>> = LazyLock::new(|| {
    let (sender, receiver) = mpsc::channel::<Task>();
    std::thread::Builder::new()
        .name("offstage-beside".into())
        .spawn(move || {
            placement::note_kept_thread();
            for task in receiver {
                // A task's panic is its own: its claim is closed, whoever
                // waits for it gets nothing (see `Claim::offer`), and the
                // thread goes on to the next task.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task));
            }
        })
        .ok()
        .map(|_| Mutex::new(sender))
});

/// Starts the kept thread now, so that the first large move does not
/// wait for it to start.
pub(in crate::session) fn start() {
    LazyLock::force(&QUEUE);
}

/// Runs `task` on the kept thread, some time soon; `false` if there is
/// no such thread (the work is then done by whoever claims it).
fn run(task: impl FnOnce() + Send + 'static) -> bool {
    placement::away_from_this_core();
    QUEUE
        .as_ref()
        .is_some_and(|queue| queue.lock_unpoisoned().send(Box::new(task)).is_ok())
}

/// Lends `shared` to `task` on the kept thread; [`Lent::reclaim`] takes
/// it back. The task gets it only if it runs before the reclaim (else it
/// does nothing), and the reclaim waits only for a task that has it.
pub(super) fn lend<T: Send + Sync + 'static>(
    shared: T,
    task: impl FnOnce(&T) + Send + 'static,
) -> Lent<T> {
    let shared = Arc::new(shared);
    let returned = Arc::new(Returned::default());
    let (lent, back) = (Arc::downgrade(&shared), returned.clone());
    run(move || {
        // Declared first, so dropped last: after the share below, even
        // if the task panics.
        let _returned = ReturnOnDrop(back);
        if let Some(shared) = lent.upgrade() {
            task(&shared);
        }
    });
    Lent { shared, returned }
}

/// `value` as a [`Lent`] lent to nobody: for work too small to hand over.
pub(super) fn keep<T>(value: T) -> Lent<T> {
    Lent {
        shared: Arc::new(value),
        returned: Arc::default(),
    }
}

/// What [`lend`] lent.
pub(super) struct Lent<T> {
    shared: Arc<T>,
    returned: Arc<Returned>,
}

impl<T> std::ops::Deref for Lent<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.shared
    }
}

impl<T> Lent<T> {
    /// The value back, once the task (if it got it) has let go of it.
    pub(super) fn reclaim(self) -> T {
        let Lent { shared, returned } = self;
        match Arc::try_unwrap(shared) {
            Ok(value) => value,
            Err(shared) => {
                let mut done = returned.done.lock_unpoisoned();
                while !*done {
                    done = returned
                        .signal
                        .wait(done)
                        .unwrap_or_else(|e| e.into_inner());
                }
                drop(done);
                Arc::try_unwrap(shared)
                    .unwrap_or_else(|_| unreachable!("only the task held a share"))
            }
        }
    }
}

/// Set once a lending task has let go of what it was lent.
#[derive(Default)]
struct Returned {
    done: Mutex<bool>,
    signal: Condvar,
}

struct ReturnOnDrop(Arc<Returned>);

impl Drop for ReturnOnDrop {
    fn drop(&mut self) {
        *self.0.done.lock_unpoisoned() = true;
        self.0.signal.notify_all();
    }
}

/// A piece of work done once, by the first thread to claim it: the kept
/// thread ([`offer`](Claim::offer)) or the one that needs its answer
/// ([`take`](Claim::take)), which waits only for work already started.
pub(super) struct Claim<T> {
    state: Mutex<State<T>>,
    finished: Condvar,
}

enum State<T> {
    Open,
    Running,
    Done(T),
    /// Taken, or given up by its taker: an offer does nothing.
    Closed,
}

impl<T> Default for Claim<T> {
    fn default() -> Self {
        Claim {
            state: Mutex::new(State::Open),
            finished: Condvar::new(),
        }
    }
}

impl<T> Claim<T> {
    /// Does the work, unless another thread has claimed it.
    pub(super) fn offer(&self, work: impl FnOnce() -> T) {
        {
            let mut state = self.state.lock_unpoisoned();
            if !matches!(*state, State::Open) {
                return;
            }
            *state = State::Running;
        }
        // If `work` panics, `Finished` closes the claim and wakes the
        // taker, who then has nothing.
        let finish = Finished(self);
        let answer = work();
        std::mem::forget(finish);
        *self.state.lock_unpoisoned() = State::Done(answer);
        self.finished.notify_all();
    }

    /// The answer if the kept thread has done the work or is doing it
    /// (waited for); `None` if nobody started it, which closes it.
    pub(super) fn take(&self) -> Option<T> {
        let mut state = self.state.lock_unpoisoned();
        loop {
            match std::mem::replace(&mut *state, State::Closed) {
                State::Open | State::Closed => return None,
                State::Done(answer) => return Some(answer),
                State::Running => {
                    *state = State::Running;
                    state = self.finished.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }
}

/// Closes a claim whose work panicked, waking its taker.
struct Finished<'a, T>(&'a Claim<T>);

impl<T> Drop for Finished<'_, T> {
    fn drop(&mut self) {
        *self.0.state.lock_unpoisoned() = State::Closed;
        self.0.finished.notify_all();
    }
}

/// Where the kept thread may run: anywhere the lender may, except the
/// lender's own core (see the module's docs).
#[cfg(target_os = "linux")]
mod placement {
    use std::sync::{
        atomic::{AtomicI32, Ordering},
        Mutex,
    };

    use crate::util::LockExt;

    /// The kept thread's id, once it runs (0 before).
    static KEPT_THREAD: AtomicI32 = AtomicI32::new(0);

    /// Held while the kept thread is placed: two lenders at once each set
    /// a whole placement, not a mix of both.
    static PLACING: Mutex<()> = Mutex::new(());

    pub(super) fn note_kept_thread() {
        // SAFETY: `gettid` has no preconditions.
        KEPT_THREAD.store(unsafe { libc::gettid() }, Ordering::SeqCst);
    }

    /// Lets the kept thread run on any core this thread may run on but
    /// the one it runs on now. Left as it was if that leaves no core (a
    /// lender bound to one) or the kernel refuses (a cpuset): placement
    /// only makes the work faster, never possible.
    pub(super) fn away_from_this_core() {
        // SAFETY: `sched_getcpu` has no preconditions.
        let here = unsafe { libc::sched_getcpu() };
        if let Ok(here) = usize::try_from(here) {
            away_from(here);
        }
    }

    /// [`away_from_this_core`] for the core `core`.
    fn away_from(core: usize) {
        let _placing = PLACING.lock_unpoisoned();
        place_away_from(core);
    }

    fn place_away_from(core: usize) {
        let kept = KEPT_THREAD.load(Ordering::SeqCst);
        if kept == 0 || core >= libc::CPU_SETSIZE as usize {
            return;
        }
        // SAFETY: a zeroed `cpu_set_t` is an empty set; the calls get its
        // true size, and `kept` names a thread of this process that lives
        // as long as the process.
        unsafe {
            let mut cores: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            if libc::sched_getaffinity(0, size, &mut cores) != 0 {
                return;
            }
            libc::CPU_CLR(core, &mut cores);
            if libc::CPU_COUNT(&cores) > 0 {
                libc::sched_setaffinity(kept, size, &cores);
            }
        }
    }

    /// Places the kept thread away from `core`, then reads the cores it
    /// may run on (`None` before it runs), with no other placement
    /// between.
    #[cfg(test)]
    pub(super) fn away_from_then_cores(core: usize) -> Option<Vec<usize>> {
        let _placing = PLACING.lock_unpoisoned();
        place_away_from(core);
        match KEPT_THREAD.load(Ordering::SeqCst) {
            0 => None,
            kept => cores_of(kept),
        }
    }

    /// The cores `thread` may run on (0: the calling thread).
    #[cfg(test)]
    pub(super) fn cores_of(thread: libc::pid_t) -> Option<Vec<usize>> {
        // SAFETY: as in `place_away_from`.
        unsafe {
            let mut cores: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            if libc::sched_getaffinity(thread, size, &mut cores) != 0 {
                return None;
            }
            let all = libc::CPU_SETSIZE as usize;
            Some((0..all).filter(|&c| libc::CPU_ISSET(c, &cores)).collect())
        }
    }
}

/// Elsewhere the scheduler places the kept thread as it likes.
#[cfg(not(target_os = "linux"))]
mod placement {
    pub(super) fn note_kept_thread() {}

    pub(super) fn away_from_this_core() {}
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::*;

    #[test]
    fn work_nobody_started_is_left_to_the_taker() {
        let claim = Claim::<u32>::default();
        assert_eq!(claim.take(), None);
        // Closed by the take: a late offer does nothing.
        claim.offer(|| panic!("a closed claim's work ran"));
        assert_eq!(claim.take(), None);
    }

    /// What the tests lend: a claim, a barrier to know the task has
    /// started, and data to get back.
    struct Shared {
        claim: Claim<u32>,
        started: Barrier,
        data: Vec<u32>,
    }

    fn shared() -> Shared {
        Shared {
            claim: Claim::default(),
            started: Barrier::new(2),
            data: vec![1, 2, 3],
        }
    }

    const A_WHILE: std::time::Duration = std::time::Duration::from_millis(50);

    #[test]
    fn work_the_kept_thread_started_is_waited_for_and_the_loan_comes_back() {
        let lent = lend(shared(), |shared| {
            shared.claim.offer(|| {
                shared.started.wait();
                std::thread::sleep(A_WHILE);
                7
            });
            // Still holding it after the work: the reclaim waits.
            std::thread::sleep(A_WHILE);
        });
        lent.started.wait();
        assert_eq!(lent.claim.take(), Some(7));
        assert_eq!(lent.reclaim().data, [1, 2, 3]);
    }

    #[test]
    fn work_that_panicked_wakes_its_taker_with_nothing_and_the_thread_lives_on() {
        let lent = lend(shared(), |shared| {
            shared.claim.offer(|| {
                shared.started.wait();
                std::thread::sleep(A_WHILE);
                panic!("the work failed")
            });
        });
        lent.started.wait();
        assert_eq!(lent.claim.take(), None);
        assert_eq!(lent.reclaim().data, [1, 2, 3]);

        let lent = lend(shared(), |shared| {
            shared.claim.offer(|| {
                shared.started.wait();
                8
            });
        });
        lent.started.wait();
        assert_eq!(lent.claim.take(), Some(8));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_lend_keeps_the_kept_thread_off_the_lenders_core() {
        // The kept thread runs: a task lent to it has run.
        let (sender, receiver) = mpsc::channel();
        let _lent = lend((), move |()| sender.send(()).unwrap());
        receiver.recv().unwrap();
        let mine = placement::cores_of(0).expect("this thread's cores");
        for &core in &mine {
            let kept = placement::away_from_then_cores(core).expect("the kept thread runs");
            if mine.len() > 1 {
                let others: Vec<usize> = mine.iter().copied().filter(|&c| c != core).collect();
                assert_eq!(kept, others, "kept off core {core}");
            } else {
                // One core: the kept thread keeps it, or would never run.
                assert!(!kept.is_empty());
            }
        }
    }

    #[test]
    fn a_task_that_runs_after_the_reclaim_gets_nothing() {
        // The kept thread, busy until `busy` is released.
        let busy = lend(shared(), |shared| {
            shared.started.wait();
        });
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let late = {
            let ran = ran.clone();
            lend(shared(), move |_| {
                ran.store(true, std::sync::atomic::Ordering::SeqCst)
            })
        };
        assert_eq!(late.reclaim().data, [1, 2, 3]);
        busy.started.wait();
        busy.reclaim();
        // Queued after `busy`: done once a third task has run.
        let (sender, receiver) = mpsc::channel();
        let _third = lend((), move |()| sender.send(()).unwrap());
        receiver.recv().unwrap();
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }
}

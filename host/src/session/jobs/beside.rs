//! A thread kept for the work a large move can do beside the thread that
//! runs its write.
//!
//! A move of a thousand jobs builds a thousand caller results and
//! serialises two thousand events, 1.5–2 ms each, while its own thread is
//! busy in SQLite; the machine has another core. A thread started for
//! each move did not get that core in time (a new thread waits on its
//! parent's core), where a thread already started and woken from its wait
//! usually runs on the idle core at once. So one thread is started once
//! per process and kept (ARCHITECTURE.md §PERF).
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

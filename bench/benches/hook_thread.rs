//! What moving an in-process plugin's hook polls to a thread of the
//! plugin's own would cost per hook call, against polling them inline on
//! the runtime worker (as the host does). The hook yields `yields` times
//! (wakes itself and returns Pending, as a hook calling the host does),
//! then answers. The measurement behind keeping hooks on the runtime's
//! workers (docs/plugins.md, "No tokio inside a plugin"):
//! `cargo bench -p offstage-bench --bench hook_thread`. Not part of
//! `scripts/bench`: a design question answered once, not a target.
use std::{
    future::Future,
    pin::Pin,
    sync::mpsc,
    task::{Context, Poll},
    time::Instant,
};

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

struct YieldOnce(bool);
impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

async fn hook(yields: u32) -> u64 {
    for _ in 0..yields {
        YieldOnce(false).await;
    }
    std::hint::black_box(7)
}

struct Unpark(std::thread::Thread);
impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// The plugin thread's executor: polls one job until it is done.
fn block_on(mut job: Job) {
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    while job.as_mut().poll(&mut cx).is_pending() {
        std::thread::park();
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::spawn(move || {
        for job in rx {
            block_on(job);
        }
    });
    rt.block_on(async move {
        const N: u32 = 20_000;
        for yields in [0u32, 4] {
            for round in 0..3 {
                let start = Instant::now();
                for _ in 0..N {
                    std::hint::black_box(hook(std::hint::black_box(yields)).await);
                }
                let inline = start.elapsed() / N;
                let start = Instant::now();
                for _ in 0..N {
                    let (done, answer) = tokio::sync::oneshot::channel();
                    tx.send(Box::pin(async move {
                        let _ = done.send(hook(yields).await);
                    }))
                    .unwrap();
                    std::hint::black_box(answer.await.unwrap());
                }
                let hop = start.elapsed() / N;
                println!(
                    "yields {yields} round {round}: inline {inline:?}, on a thread of its own {hop:?} ({:.0}x)",
                    hop.as_secs_f64() / inline.as_secs_f64().max(1e-9)
                );
            }
        }
    });
}

//! The bounded CPU pool that decodes recordings: `threads` OS threads named `decode-N`, outside
//! the async runtime, taking recordings in the order they arrive. A thread that finishes one
//! takes the next at once: no hand-off through the async runtime (a permit released only when
//! the job's task is polled again) stands between two decodes, so the pool stays busy whenever
//! recordings wait, however busy the runtime's own threads are.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tokio::sync::oneshot;

type Task = Box<dyn FnOnce() + Send>;

/// Dropping the pool closes its queue: each thread ends after the work already queued (whose
/// callers are gone by then, so it is skipped). The threads are not joined, so dropping the
/// pool never blocks the async runtime.
pub struct DecodePool {
    sender: Sender<Task>,
    threads: usize,
}

/// What one call of [`DecodePool::run`] gives back.
pub struct Ran<T> {
    pub value: T,
    /// From the call to a thread starting the work.
    pub waited: Duration,
}

/// The work panicked (the message is the panic's), or the pool stopped before running it.
#[derive(Debug)]
pub struct Crashed(pub String);

impl DecodePool {
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let (sender, receiver) = crossbeam_channel::unbounded::<Task>();
        let threads = threads.max(1);
        for i in 0..threads {
            let receiver: Receiver<Task> = receiver.clone();
            std::thread::Builder::new()
                .name(format!("decode-{i}"))
                .spawn(move || {
                    // Ends when the pool is dropped and the queue is empty.
                    for task in receiver {
                        task();
                    }
                })?;
        }
        Ok(Self { sender, threads })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `work` on the pool and waits for it. Work whose caller stopped waiting before a
    /// thread reached it is skipped.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Ran<T>, Crashed> {
        let (reply, answer) = oneshot::channel();
        let queued = Instant::now();
        let task: Task = Box::new(move || {
            if reply.is_closed() {
                return;
            }
            let waited = queued.elapsed();
            let outcome = catch_unwind(AssertUnwindSafe(work))
                .map(|value| Ran { value, waited })
                .map_err(|panic| Crashed(panic_message(panic.as_ref())));
            // The caller may have stopped waiting meanwhile; nothing to do then.
            let _ = reply.send(outcome);
        });
        if self.sender.send(task).is_err() {
            return Err(Crashed("the decode pool has stopped".into()));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(Crashed("the decode pool dropped the work".into())))
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "decoder panicked".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn runs_work_on_named_threads_and_reports_panics() {
        let pool = DecodePool::new(2).expect("pool");
        assert_eq!(pool.threads(), 2);
        let ran = pool
            .run(|| std::thread::current().name().map(str::to_owned))
            .await
            .expect("ran");
        assert!(ran.value.expect("named").starts_with("decode-"));
        let crashed = pool
            .run(|| -> u32 { panic!("bad frame") })
            .await
            .err()
            .expect("a panic is an error");
        assert_eq!(crashed.0, "bad frame");
        // The thread that panicked still serves.
        assert_eq!(pool.run(|| 7).await.expect("ran").value, 7);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_runs_more_than_its_threads_at_once() {
        let pool = Arc::new(DecodePool::new(3).expect("pool"));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let calls: Vec<_> = (0..24)
            .map(|_| {
                let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    pool.run(move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(5));
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                    .expect("ran")
                    .waited
                })
            })
            .collect();
        let mut waited = Vec::new();
        for call in calls {
            waited.push(call.await.expect("joined"));
        }
        assert_eq!(most.load(Ordering::SeqCst), 3);
        // 24 calls of 5 ms on 3 threads: the last ones waited for the first.
        assert!(waited.iter().max().expect("some") >= &Duration::from_millis(20));
    }

    #[tokio::test]
    async fn work_whose_caller_left_is_skipped() {
        let pool = DecodePool::new(1).expect("pool");
        let ran = Arc::new(AtomicUsize::new(0));
        // Holds the one thread while the second call is dropped.
        let (hold, release) = std::sync::mpsc::channel::<()>();
        let first = pool.run(move || {
            let _ = release.recv();
        });
        let counted = ran.clone();
        let second = pool.run(move || counted.fetch_add(1, Ordering::SeqCst));
        tokio::pin!(first);
        // Queue both, then give up on the second before the thread is free.
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut first)
            .await
            .is_err());
        drop(tokio::time::timeout(Duration::from_millis(1), second).await);
        hold.send(()).expect("first waits");
        first.await.expect("first ran");
        assert_eq!(pool.run(|| 1).await.expect("ran").value, 1);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }
}

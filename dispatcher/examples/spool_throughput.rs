//! How many messages a second the local spool hands out, received as the pipeline receives them:
//! `spool_throughput [MESSAGES] [RECEIVERS] [IN_FLIGHT] [WORK_MS]` (defaults 11000, 8, 288, 50).
//! Each receiver takes one free in-flight slot, then as many more as are free (at most 10), and
//! receives that many; each message is "worked on" for WORK_MS, then deleted through the
//! consumer's batching deleter (20 ms linger) and its slot freed as the consumer frees it.
//! Prints messages per second, receive calls, and the mean messages per receive.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dispatcher::lifecycle::deleter::Deleter;
use dispatcher::queue::spool::SpoolQueue;
use dispatcher::queue::Queue;
use tokio::sync::Semaphore;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let arg = |i: usize, default: u64| -> anyhow::Result<u64> {
        std::env::args()
            .nth(i)
            .map_or(Ok(default), |a| a.parse().map_err(anyhow::Error::from))
    };
    let (messages, receivers, in_flight, work_ms) =
        (arg(1, 11_000)?, arg(2, 8)?, arg(3, 288)?, arg(4, 50)?);
    let dir = tempfile::tempdir()?;
    let spool = Arc::new(SpoolQueue::open(dir.path(), 5)?);
    let sending = Instant::now();
    for i in 0..messages {
        spool.send_one(&format!("{{\"job\":{i}}}"))?;
    }
    println!(
        "sent {messages} messages in {:.2} s",
        sending.elapsed().as_secs_f64()
    );
    let slots = Arc::new(Semaphore::new(in_flight as usize));
    let deleter = Deleter::spawn(spool.clone(), Duration::from_millis(20));
    let (done, receives) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..receivers {
        let (spool, slots, done, receives, deleter) = (
            spool.clone(),
            slots.clone(),
            done.clone(),
            receives.clone(),
            deleter.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let mut permits = vec![slots.clone().acquire_owned().await?];
                while permits.len() < 10 {
                    match slots.clone().try_acquire_owned() {
                        Ok(p) => permits.push(p),
                        Err(_) => break,
                    }
                }
                let got = spool
                    .receive(permits.len(), Duration::ZERO, Duration::from_secs(300))
                    .await?;
                receives.fetch_add(1, Ordering::Relaxed);
                if got.is_empty() && done.load(Ordering::Relaxed) + in_flight >= messages {
                    if done.load(Ordering::Relaxed) >= messages {
                        return anyhow::Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                for message in got {
                    let Some(permit) = permits.pop() else { break };
                    let (deleter, done) = (deleter.clone(), done.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(work_ms)).await;
                        if let Err(e) = deleter.delete(message.receipt).await {
                            eprintln!("delete failed: {e}");
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                        drop(permit);
                    });
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let calls = receives.load(Ordering::Relaxed);
    println!(
        "received and deleted {messages} in {elapsed:.2} s: {:.0} messages/s, {calls} receive calls ({:.1} messages each)",
        messages as f64 / elapsed,
        messages as f64 / calls as f64
    );
    Ok(())
}

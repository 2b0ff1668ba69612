//! Which queued requests form the next batch, and when. A plain struct driven by explicit
//! `now` values, so tests exercise every rule without a runtime or real time.
//!
//! Rules, in order:
//! 1. Requests past their deadline are taken out (the caller answers them `DeadlineExceeded`);
//!    cancelled ones are removed by [`BatchQueue::cancel`] / [`BatchQueue::retain`].
//! 2. The oldest interactive request anchors the next batch, else the oldest batch request, so
//!    a person waiting at the API goes before a queue of jobs, and nothing of one priority
//!    starves: a long segment that never finds companions still goes first once it is the
//!    oldest of its priority.
//! 3. Companions are interactive requests first, then batch ones (which fill what room an
//!    interactive batch leaves); within each, from the anchor's length bucket first (powers of
//!    two of feature frames), then the nearest buckets, oldest first within a bucket, while the
//!    padded cost
//!    `longest × count` stays within the frame budget and the count within the largest preferred
//!    size. The anchor alone may exceed the budget (it runs by itself).
//! 4. The batch runs now, whole, if the anchor has waited `max_wait` or the budget stopped it
//!    while more requests wait; else trimmed to the largest preferred size it reaches, if any.
//!    Otherwise the caller waits until the anchor's wait runs out (or the earliest deadline, to
//!    answer it on time). With `max_wait` 0 the policy is work-conserving: whenever the engine
//!    asks, what has queued runs at once (batches form while the previous one runs).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub use worker_protocol::Priority;

/// Batching limits (validated by [`BatchPolicyConfig::new`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BatchPolicyConfig {
    preferred_sizes: Vec<usize>,
    max_wait: Duration,
    max_padded_frames: usize,
}

impl BatchPolicyConfig {
    pub fn new(
        mut preferred_sizes: Vec<usize>,
        max_wait: Duration,
        max_padded_frames: usize,
    ) -> Result<Self, String> {
        preferred_sizes.sort_unstable();
        preferred_sizes.dedup();
        if preferred_sizes.is_empty() || preferred_sizes[0] == 0 {
            return Err("preferred batch sizes must be non-empty and positive".into());
        }
        if max_padded_frames == 0 {
            return Err("the padded frame budget must be positive".into());
        }
        Ok(Self {
            preferred_sizes,
            max_wait,
            max_padded_frames,
        })
    }

    pub fn max_batch_size(&self) -> usize {
        *self
            .preferred_sizes
            .last()
            .expect("validated non-empty (bug)")
    }
}

/// One queued request. `frames` is its length in feature frames (the padding cost unit).
#[derive(Debug)]
pub struct Queued<T> {
    pub key: u64,
    pub frames: usize,
    pub arrived: Instant,
    pub deadline: Option<Instant>,
    pub priority: Priority,
    pub payload: T,
}

/// What to do now.
#[derive(Debug)]
pub enum Decision<T> {
    Run(Vec<Queued<T>>),
    /// Nothing is due; ask again at this instant (or when a request arrives).
    WaitUntil(Instant),
    Empty,
}

#[derive(Debug)]
pub struct BatchQueue<T> {
    config: BatchPolicyConfig,
    queue: VecDeque<Queued<T>>,
}

fn bucket(frames: usize) -> u32 {
    frames.max(1).next_power_of_two().trailing_zeros()
}

impl<T> BatchQueue<T> {
    pub fn new(config: BatchPolicyConfig) -> Self {
        Self {
            config,
            queue: VecDeque::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Appends in arrival order (callers push as requests arrive), interactive requests ahead
    /// of every batch one: the queue is always the interactive ones, oldest first, then the
    /// batch ones, oldest first (rule 2's anchor is its front).
    pub fn push(&mut self, item: Queued<T>) {
        let at = match item.priority {
            Priority::Batch => self.queue.len(),
            Priority::Interactive => self
                .queue
                .iter()
                .position(|q| q.priority == Priority::Batch)
                .unwrap_or(self.queue.len()),
        };
        self.queue.insert(at, item);
    }

    /// Removes a not-yet-started request.
    pub fn cancel(&mut self, key: u64) -> Option<Queued<T>> {
        let at = self.queue.iter().position(|q| q.key == key)?;
        self.queue.remove(at)
    }

    /// Keeps only requests for which `keep` holds (e.g. whose client is still connected);
    /// returns the removed ones.
    pub fn retain(&mut self, mut keep: impl FnMut(&Queued<T>) -> bool) -> Vec<Queued<T>> {
        let mut dropped = Vec::new();
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for q in self.queue.drain(..) {
            if keep(&q) {
                kept.push_back(q);
            } else {
                dropped.push(q);
            }
        }
        self.queue = kept;
        dropped
    }

    /// Takes out requests whose deadline has passed.
    pub fn take_expired(&mut self, now: Instant) -> Vec<Queued<T>> {
        self.retain(|q| q.deadline.is_none_or(|d| d > now))
    }

    pub fn next_batch(&mut self, now: Instant) -> Decision<T> {
        let Some(anchor) = self.queue.front() else {
            return Decision::Empty;
        };
        let anchor_bucket = bucket(anchor.frames);
        let due_at = anchor.arrived + self.config.max_wait;
        let max_size = self.config.max_batch_size();

        // Candidates other than the anchor: interactive first, then nearest bucket, then oldest.
        let mut order: Vec<usize> = (1..self.queue.len()).collect();
        order.sort_by_key(|&i| {
            let q = &self.queue[i];
            (
                q.priority == Priority::Batch,
                bucket(q.frames).abs_diff(anchor_bucket),
                i,
            )
        });

        let mut chosen = vec![0usize];
        let mut longest = anchor.frames;
        let mut budget_hit = false;
        for i in order {
            if chosen.len() == max_size {
                break;
            }
            let new_longest = longest.max(self.queue[i].frames);
            if new_longest * (chosen.len() + 1) > self.config.max_padded_frames {
                budget_hit = true;
                continue;
            }
            longest = new_longest;
            chosen.push(i);
        }

        let reached = self
            .config
            .preferred_sizes
            .iter()
            .rev()
            .find(|&&p| p <= chosen.len())
            .copied();
        let take = if budget_hit || now >= due_at {
            // Due (or full): everything chosen goes now, not a preferred size and a remainder.
            chosen.len()
        } else if let Some(preferred) = reached {
            preferred
        } else {
            // Wake for whichever comes first: the anchor's wait or someone's deadline.
            let earliest_deadline = self.queue.iter().filter_map(|q| q.deadline).min();
            return Decision::WaitUntil(earliest_deadline.map_or(due_at, |d| d.min(due_at)));
        };
        // `chosen` is in preference order: the anchor, then nearest buckets.
        chosen.truncate(take);
        chosen.sort_unstable();
        let mut batch = Vec::with_capacity(take);
        for (removed, i) in chosen.into_iter().enumerate() {
            batch.push(
                self.queue
                    .remove(i - removed)
                    .expect("index from this queue (bug)"),
            );
        }
        Decision::Run(batch)
    }
}

#[cfg(test)]
mod tests;

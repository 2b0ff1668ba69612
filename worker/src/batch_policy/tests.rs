#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use super::*;

const MS: Duration = Duration::from_millis(1);

fn config(budget: usize) -> BatchPolicyConfig {
    BatchPolicyConfig::new(vec![16, 4, 8], 50 * MS, budget).unwrap()
}

fn q(key: u64, frames: usize, arrived: Instant) -> Queued<()> {
    Queued {
        key,
        frames,
        arrived,
        deadline: None,
        priority: Priority::Batch,
        payload: (),
    }
}

fn interactive(key: u64, frames: usize, arrived: Instant) -> Queued<()> {
    Queued {
        priority: Priority::Interactive,
        ..q(key, frames, arrived)
    }
}

fn keys(d: Decision<()>) -> Vec<u64> {
    match d {
        Decision::Run(b) => b.iter().map(|q| q.key).collect(),
        other => panic!("expected a batch, got {other:?}"),
    }
}

#[test]
fn config_rejects_empty_and_zero() {
    assert!(BatchPolicyConfig::new(vec![], MS, 1).is_err());
    assert!(BatchPolicyConfig::new(vec![0, 4], MS, 1).is_err());
    assert!(BatchPolicyConfig::new(vec![4], MS, 0).is_err());
}

#[test]
fn empty_queue_is_empty() {
    let mut queue = BatchQueue::<()>::new(config(100_000));
    assert!(matches!(queue.next_batch(Instant::now()), Decision::Empty));
}

#[test]
fn below_smallest_preferred_waits_until_max_wait_then_runs() {
    let t0 = Instant::now();
    let mut queue = BatchQueue::new(config(100_000));
    for k in 0..3 {
        queue.push(q(k, 300, t0 + k as u32 * MS));
    }
    match queue.next_batch(t0 + 10 * MS) {
        Decision::WaitUntil(t) => assert_eq!(t, t0 + 50 * MS, "bound set by the oldest"),
        other => panic!("{other:?}"),
    }
    assert_eq!(keys(queue.next_batch(t0 + 50 * MS)), vec![0, 1, 2]);
    assert!(queue.is_empty());
}

#[test]
fn fills_to_largest_reached_preferred_size_immediately() {
    let t0 = Instant::now();
    let mut queue = BatchQueue::new(config(1_000_000));
    for k in 0..11 {
        queue.push(q(k, 300, t0));
    }
    // 11 waiting: 8 is the largest preferred size reached; no waiting.
    assert_eq!(keys(queue.next_batch(t0)), (0..8).collect::<Vec<_>>());
    // 3 left: below 4, so they wait for the bound.
    assert!(matches!(queue.next_batch(t0), Decision::WaitUntil(_)));
    for k in 11..40 {
        queue.push(q(k, 300, t0));
    }
    assert_eq!(
        queue.next_batch(t0 + MS).len_or_zero(),
        16,
        "capped at the largest"
    );
}

trait LenOrZero {
    fn len_or_zero(self) -> usize;
}
impl LenOrZero for Decision<()> {
    fn len_or_zero(self) -> usize {
        match self {
            Decision::Run(b) => b.len(),
            _ => 0,
        }
    }
}

#[test]
fn padded_budget_limits_batch_and_runs_without_waiting() {
    let t0 = Instant::now();
    // Room for 3 × 1000 padded frames.
    let mut queue = BatchQueue::new(config(3_000));
    for k in 0..5 {
        queue.push(q(k, 1000, t0));
    }
    // The budget, not a preferred size, bounds it: run 3 now rather than wait for 4.
    assert_eq!(keys(queue.next_batch(t0)), vec![0, 1, 2]);
}

#[test]
fn companions_come_from_the_anchors_length_bucket() {
    let t0 = Instant::now();
    let mut queue = BatchQueue::new(config(4 * 3000));
    // Oldest is short; long and short alternate.
    for k in 0..8 {
        let frames = if k % 2 == 0 { 200 } else { 3000 };
        queue.push(q(k, frames, t0 + k as u32 * MS));
    }
    // Short anchor takes the other short ones (4 × 200), not the long ones.
    assert_eq!(keys(queue.next_batch(t0 + 8 * MS)), vec![0, 2, 4, 6]);
    // Then the long ones together: 4 × 3000 fits the budget exactly.
    assert_eq!(keys(queue.next_batch(t0 + 8 * MS)), vec![1, 3, 5, 7]);
}

#[test]
fn long_segment_is_not_starved_by_a_stream_of_short_ones() {
    let t0 = Instant::now();
    let mut queue = BatchQueue::new(config(16 * 400));
    queue.push(q(999, 20_000, t0)); // over the whole budget on its own
    let mut next_key = 0;
    let mut ran_long_at = None;
    for round in 0..10u32 {
        let now = t0 + round * 10 * MS;
        for _ in 0..16 {
            queue.push(q(next_key, 300, now));
            next_key += 1;
        }
        if let Decision::Run(batch) = queue.next_batch(now) {
            if batch.iter().any(|q| q.key == 999) {
                assert_eq!(batch.len(), 1, "runs alone: nothing else fits its padding");
                ran_long_at = Some(round);
                break;
            }
        }
    }
    assert_eq!(
        ran_long_at,
        Some(0),
        "the oldest request anchors the first batch"
    );
}

#[test]
fn cancelled_and_disconnected_requests_are_dropped() {
    let t0 = Instant::now();
    let mut queue = BatchQueue::new(config(100_000));
    for k in 0..6 {
        queue.push(q(k, 100, t0));
    }
    assert_eq!(queue.cancel(2).map(|q| q.key), Some(2));
    assert!(queue.cancel(2).is_none());
    let dropped = queue.retain(|q| q.key != 4);
    assert_eq!(dropped.iter().map(|q| q.key).collect::<Vec<_>>(), vec![4]);
    assert_eq!(keys(queue.next_batch(t0)), vec![0, 1, 3, 5]);
}

#[test]
fn expired_requests_are_taken_out_before_batching() {
    let t0 = Instant::now();
    let mut queue = BatchQueue::new(config(100_000));
    let mut late = q(1, 100, t0);
    late.deadline = Some(t0 + 5 * MS);
    queue.push(late);
    queue.push(q(2, 100, t0));
    assert!(queue.take_expired(t0 + 4 * MS).is_empty());
    let expired = queue.take_expired(t0 + 5 * MS);
    assert_eq!(expired.iter().map(|q| q.key).collect::<Vec<_>>(), vec![1]);
    assert_eq!(queue.len(), 1);
}

#[test]
fn waiting_wakes_for_the_earliest_deadline() {
    let t0 = Instant::now();
    let mut queue = BatchQueue::new(config(100_000));
    queue.push(q(1, 100, t0));
    let mut urgent = q(2, 100, t0);
    urgent.deadline = Some(t0 + 10 * MS);
    queue.push(urgent);
    match queue.next_batch(t0) {
        Decision::WaitUntil(t) => assert_eq!(t, t0 + 10 * MS),
        other => panic!("{other:?}"),
    }
}

#[test]
fn zero_wait_runs_at_once_with_everything_queued() {
    let t0 = Instant::now();
    let mut queue =
        BatchQueue::new(BatchPolicyConfig::new(vec![4, 8, 16], Duration::ZERO, 1_000_000).unwrap());
    // A lone request does not wait for companions.
    queue.push(q(0, 300, t0));
    assert_eq!(keys(queue.next_batch(t0)), vec![0]);
    // Seven queued while the engine was busy: one batch of 7, not 4 and then 3.
    for k in 1..8 {
        queue.push(q(k, 300, t0 + MS));
    }
    assert_eq!(keys(queue.next_batch(t0 + MS)), (1..8).collect::<Vec<_>>());
    // Still capped at the largest preferred size.
    for k in 8..30 {
        queue.push(q(k, 300, t0 + 2 * MS));
    }
    assert_eq!(queue.next_batch(t0 + 2 * MS).len_or_zero(), 16);
}

#[test]
fn an_interactive_request_anchors_before_older_batch_ones() {
    let t0 = Instant::now();
    // Budget for 4 segments of 1000 frames: the batch queue alone would fill two batches.
    let mut queue = BatchQueue::new(BatchPolicyConfig::new(vec![4], 50 * MS, 4_000).unwrap());
    for k in 0..8 {
        queue.push(q(k, 1_000, t0 + k as u32 * MS));
    }
    queue.push(interactive(100, 1_000, t0 + 20 * MS));
    queue.push(interactive(101, 1_000, t0 + 21 * MS));
    // The interactive ones first (oldest of them anchors), then the oldest batch ones fill up.
    assert_eq!(keys(queue.next_batch(t0 + 22 * MS)), vec![100, 101, 0, 1]);
    assert_eq!(keys(queue.next_batch(t0 + 22 * MS)), vec![2, 3, 4, 5]);
}

#[test]
fn interactive_companions_come_before_batch_ones_of_a_nearer_length() {
    let t0 = Instant::now();
    let mut queue = BatchQueue::new(BatchPolicyConfig::new(vec![2], 50 * MS, 1_000_000).unwrap());
    // The anchor is 1000 frames; a batch request of the same length bucket and an interactive
    // one four buckets longer: the interactive one joins, the batch one waits.
    queue.push(q(1, 1_000, t0));
    queue.push(interactive(2, 1_000, t0 + MS));
    queue.push(interactive(3, 16_000, t0 + 2 * MS));
    assert_eq!(keys(queue.next_batch(t0 + 3 * MS)), vec![2, 3]);
    assert_eq!(keys(queue.next_batch(t0 + 60 * MS)), vec![1]);
}

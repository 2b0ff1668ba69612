//! The closing report of a run that ends (`local`, `run --exit-when-idle`): the wall time, the
//! audio it transcribed and where the time went.

use std::time::Instant;

use dispatcher::lifecycle::Consumer;
use dispatcher::metrics::Metrics;

use super::limit::{limit, RunTimes};

/// Seconds from `started` to the last job's end (the empty receive that ends an idle run is not
/// work), or to now when no job finished.
pub(crate) fn wall_s(consumer: &Consumer, started: Instant) -> f64 {
    consumer
        .last_finished()
        .map_or_else(
            || started.elapsed(),
            |t| t.saturating_duration_since(started),
        )
        .as_secs_f64()
}

/// Where the time went, per pipeline stage: jobs, total seconds (summed over jobs running at
/// the same time, so stages can exceed the wall time) and the mean per job, then what set the
/// pace ([`super::limit`]). The wall runs from the consumer's start (the engine is ready by
/// then) to the last job's end.
pub(crate) fn stage_table(metrics: &Metrics, wall_s: f64, decode_threads: usize) -> String {
    let registry = metrics.registry();
    let registry = registry.lock().unwrap_or_else(|p| p.into_inner());
    let audio_s = registry.audio_seconds_total();
    let mut out = format!(
        "wall {wall_s:.2} s · audio {audio_s:.1} s · {:.0} audio-s/s\n",
        if wall_s > 0.0 { audio_s / wall_s } else { 0.0 }
    );
    let stages = registry.stage_totals();
    for &(stage, count, sum) in &stages {
        if count == 0 {
            continue;
        }
        out.push_str(&format!(
            "stage {:<12} {count:>7} jobs {sum:>10.2} s total {:>9.2} ms mean\n",
            stage.label(),
            1000.0 * sum / count as f64
        ));
    }
    let times = RunTimes {
        stages: &stages,
        wall_s,
        decode_threads,
    };
    if let Some(limit) = limit(&times) {
        out.push_str(&format!("{limit}\n"));
    }
    out
}

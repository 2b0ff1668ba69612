//! Optional per-stage timing of a forward pass: each lap waits for the stream, so a profiled run
//! is slower than a plain one and only the split between stages is meaningful.

use std::time::Instant;

use crate::device::CudaEngine;
use crate::error::Result;

/// Wall time per encoder stage, summed over layers, in seconds.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StageTimes {
    /// Workspace allocation, feature subsampling and the position table.
    pub subsampling_s: f64,
    pub feed_forward_s: f64,
    pub attention_s: f64,
    pub conv_s: f64,
    /// Residual adds and LayerNorms.
    pub norms_s: f64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Stage {
    Subsampling,
    FeedForward,
    Attention,
    Conv,
    Norms,
}

pub(crate) struct Laps {
    last: Instant,
    pub(crate) times: StageTimes,
}

impl Laps {
    pub(crate) fn start(engine: &CudaEngine) -> Result<Self> {
        engine.synchronize()?;
        Ok(Self {
            last: Instant::now(),
            times: StageTimes::default(),
        })
    }

    /// Charges the time since the previous lap (after the stream drains) to `stage`.
    pub(crate) fn lap(&mut self, engine: &CudaEngine, stage: Stage) -> Result<()> {
        engine.synchronize()?;
        let now = Instant::now();
        let seconds = (now - self.last).as_secs_f64();
        self.last = now;
        let slot = match stage {
            Stage::Subsampling => &mut self.times.subsampling_s,
            Stage::FeedForward => &mut self.times.feed_forward_s,
            Stage::Attention => &mut self.times.attention_s,
            Stage::Conv => &mut self.times.conv_s,
            Stage::Norms => &mut self.times.norms_s,
        };
        *slot += seconds;
        Ok(())
    }
}

/// Laps only when profiling.
pub(crate) fn lap(laps: &mut Option<Laps>, engine: &CudaEngine, stage: Stage) -> Result<()> {
    match laps {
        Some(laps) => laps.lap(engine, stage),
        None => Ok(()),
    }
}

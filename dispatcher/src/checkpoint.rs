//! A long recording's checkpoints, kept in its result location beside the outputs: one
//! `ckpt-NNNN-HASH.json` per run of segments, holding those segments' transcripts. The
//! location already names the input's content and the model; the name's hash names the exact
//! segments, so a checkpoint is only ever loaded for the same cut of the same audio (another
//! segmentation writes other names). Written create-only like every result file: two deliveries
//! of one job write the same transcripts, and the first one stays. They stay after the job is
//! done, as a record of how it was computed.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::error::{DispatchError, Result};
use crate::lifecycle::retry::RetrySettings;
use crate::outputs::{ResultLocation, Writer};
use crate::recording::{Checkpoints, Piece};
use crate::store::ObjectStore;

const CHECKPOINT_SCHEMA_VERSION: u32 = 1;
/// Largest checkpoint read back (an hour of speech is a few MB of JSON).
const MAX_CHECKPOINT_BYTES: u64 = 256 << 20;

/// A checkpoint's contents (`P`: the pieces, owned when read, borrowed when written).
#[derive(Serialize, Deserialize)]
struct Saved<P> {
    schema_version: u32,
    /// Sample ranges (16 kHz) of the segments, as cut when it was saved.
    segments: Vec<(usize, usize)>,
    pieces: P,
}

/// Checkpoints of one job in its result location, written through the store from the blocking
/// thread that transcribes (each call waits on the async runtime).
pub struct StoreCheckpoints {
    store: Arc<dyn ObjectStore>,
    retry: RetrySettings,
    loc: ResultLocation,
    every_samples: usize,
    /// Cancelled when the job must stop at its next checkpoint.
    stop: CancellationToken,
    runtime: Handle,
    /// Checkpoints loaded instead of transcribed by this attempt.
    loaded: AtomicUsize,
}

impl StoreCheckpoints {
    /// Checkpoints in `loc`; call from within the async runtime.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        retry: RetrySettings,
        loc: ResultLocation,
        every_samples: usize,
        stop: CancellationToken,
    ) -> Self {
        Self {
            store,
            retry,
            loc,
            every_samples,
            stop,
            runtime: Handle::current(),
            loaded: AtomicUsize::new(0),
        }
    }

    fn writer(&self) -> Writer<'_> {
        Writer {
            store: self.store.as_ref(),
            retry: self.retry,
        }
    }

    /// How many checkpoints this attempt loaded instead of transcribing.
    pub fn loaded(&self) -> usize {
        self.loaded.load(Ordering::SeqCst)
    }

    /// The key of checkpoint `index` of `segments`.
    pub fn key(&self, index: usize, segments: &[Range<usize>]) -> String {
        let mut hash = Sha256::new();
        for s in segments {
            hash.update(s.start.to_le_bytes());
            hash.update(s.end.to_le_bytes());
        }
        let hex = format!("{:x}", hash.finalize());
        self.loc.key(&format!("ckpt-{index:04}-{}.json", &hex[..8]))
    }
}

fn ranges(segments: &[Range<usize>]) -> Vec<(usize, usize)> {
    segments.iter().map(|s| (s.start, s.end)).collect()
}

impl Checkpoints for StoreCheckpoints {
    fn every_samples(&self) -> usize {
        self.every_samples
    }

    fn load(&self, index: usize, segments: &[Range<usize>]) -> Result<Option<Vec<Piece>>> {
        let key = self.key(index, segments);
        let Some(bytes) = self.runtime.block_on(self.writer().read_if_present(
            &self.loc.bucket,
            &key,
            MAX_CHECKPOINT_BYTES,
        ))?
        else {
            return Ok(None);
        };
        match serde_json::from_slice::<Saved<Vec<Piece>>>(&bytes) {
            Ok(saved)
                if saved.schema_version == CHECKPOINT_SCHEMA_VERSION
                    && saved.segments == ranges(segments)
                    && saved.pieces.len() == segments.len() =>
            {
                self.loaded.fetch_add(1, Ordering::SeqCst);
                tracing::debug!(key, "checkpoint loaded");
                Ok(Some(saved.pieces))
            }
            Ok(_) => {
                tracing::warn!(key, "checkpoint is for other segments; transcribing again");
                Ok(None)
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "checkpoint unreadable; transcribing again");
                Ok(None)
            }
        }
    }

    fn save(&self, index: usize, segments: &[Range<usize>], pieces: &[Piece]) -> Result<()> {
        let key = self.key(index, segments);
        let saved = Saved {
            schema_version: CHECKPOINT_SCHEMA_VERSION,
            segments: ranges(segments),
            pieces,
        };
        let body = serde_json::to_vec(&saved).map_err(|e| {
            DispatchError::Inference(format!("checkpoint does not serialize (bug): {e}"))
        })?;
        // An existing one is another delivery's transcripts of the same segments.
        self.runtime.block_on(self.writer().put(
            &self.loc.bucket,
            &key,
            Bytes::from(body),
            "application/json",
        ))?;
        tracing::debug!(key, "checkpoint written");
        Ok(())
    }

    fn stop_requested(&self) -> bool {
        self.stop.is_cancelled()
    }
}

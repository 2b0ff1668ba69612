//! [`GpuEncoder::prepare_device`]: the encoder's input computed on the device from PCM, so the
//! host only uploads audio.

use cudarc::driver::CudaSlice;

use super::{EncoderInput, GpuEncoder};
use crate::device::CudaEngine;
use crate::error::{CudaEngineError, Result};
use crate::features::GpuFeatures;
use crate::storage::Storage;

impl<S: Storage> GpuEncoder<S> {
    /// Log-mel features of a batch of 16 kHz mono clips, computed by `features` on the device
    /// and laid out as the encoder's padded input (ordered on the engine's stream).
    pub fn prepare_device(
        &self,
        engine: &CudaEngine,
        features: &GpuFeatures,
        pcm: &[&[f32]],
    ) -> Result<EncoderInput> {
        let feat_in = self.cfg.feat_in;
        if features.n_mels() != feat_in {
            return Err(CudaEngineError::Shape {
                op: "GpuEncoder::prepare_device",
                detail: format!(
                    "the features have {} mels, the encoder takes {feat_in}",
                    features.n_mels()
                ),
            });
        }
        let computed = features.compute(engine, pcm)?;
        let layout = computed.layout;
        Ok(EncoderInput {
            features: computed.data,
            lengths: self.subsampling.lengths(engine, &layout.frames)?,
            batch: layout.batch,
            time: layout.time,
        })
    }
}

impl EncoderInput {
    /// The feature buffer, to hand back with [`GpuFeatures::recycle`] once the encoder pass
    /// that reads it has been queued.
    pub fn into_feature_buffer(self) -> CudaSlice<f32> {
        self.features
    }
}

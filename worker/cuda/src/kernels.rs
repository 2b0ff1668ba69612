//! The kernel modules (CUDA C under `kernels/`, compiled by NVRTC when an engine starts) and the
//! functions each one exports.

use crate::storage::StorageKind;

/// Every module's source starts with these helpers (bf16 conversion, block reductions).
const COMMON: &str = include_str!("../kernels/common.cuh");

/// One NVRTC compilation unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum KernelModule {
    Convert,
    Activation,
    LayerNorm,
    Softmax,
    DepthwiseConv,
    Subsampling,
    ResidualNorm,
    Attention,
    Decoder,
    Features,
    FusedAttention,
}

impl KernelModule {
    pub(crate) const ALL: [KernelModule; 11] = [
        KernelModule::Convert,
        KernelModule::Activation,
        KernelModule::LayerNorm,
        KernelModule::Softmax,
        KernelModule::DepthwiseConv,
        KernelModule::Subsampling,
        KernelModule::ResidualNorm,
        KernelModule::Attention,
        KernelModule::Decoder,
        KernelModule::Features,
        KernelModule::FusedAttention,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            KernelModule::Convert => "convert",
            KernelModule::Activation => "activation",
            KernelModule::LayerNorm => "layer_norm",
            KernelModule::Softmax => "softmax",
            KernelModule::DepthwiseConv => "depthwise_conv",
            KernelModule::Subsampling => "subsampling",
            KernelModule::ResidualNorm => "residual_norm",
            KernelModule::Attention => "attention",
            KernelModule::Decoder => "decoder",
            KernelModule::Features => "features",
            KernelModule::FusedAttention => "fused_attention",
        }
    }

    fn body(self) -> &'static str {
        match self {
            KernelModule::Convert => include_str!("../kernels/convert.cu"),
            KernelModule::Activation => include_str!("../kernels/activation.cu"),
            KernelModule::LayerNorm => include_str!("../kernels/layer_norm.cu"),
            KernelModule::Softmax => include_str!("../kernels/softmax.cu"),
            KernelModule::DepthwiseConv => include_str!("../kernels/depthwise_conv.cu"),
            KernelModule::Subsampling => include_str!("../kernels/subsampling.cu"),
            KernelModule::ResidualNorm => include_str!("../kernels/residual_norm.cu"),
            KernelModule::Attention => include_str!("../kernels/attention.cu"),
            KernelModule::Decoder => include_str!("../kernels/decoder.cu"),
            KernelModule::Features => include_str!("../kernels/features.cu"),
            KernelModule::FusedAttention => include_str!("../kernels/fused_attention.cu"),
        }
    }

    /// Whether the module's kernels read or write `bf16_t` storage, so it is also built for
    /// f32 storage (the decoder: its exact f32 build beside the bf16 tensor-core one). The
    /// features are f32 throughout; the fused attention runs bf16 tensor-core products only.
    pub(crate) fn has_storage_variant(self) -> bool {
        !matches!(self, KernelModule::Features | KernelModule::FusedAttention)
    }

    /// The translation unit for one storage type.
    pub(crate) fn source_for(self, storage: StorageKind) -> String {
        let define = match storage {
            StorageKind::Bf16 => "",
            StorageKind::F32 => "#define CUDA_ENGINE_F32_STORAGE\n",
        };
        format!("{define}{COMMON}\n{}", self.body())
    }
}

/// One `extern "C" __global__` function. The discriminant indexes the engine's function table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    F32ToBf16,
    Bf16ToF32,
    Silu,
    Glu,
    LayerNorm,
    AddLayerNorm,
    MaskedSoftmax,
    DepthwiseConv1d,
    SubsampleConv0Relu,
    SubsampleDepthwise,
    SubsampleConv0Depthwise,
    ReluInplace,
    LayerNormF32,
    AddLayerNormF32,
    AddLayerNormF32Inplace,
    SplitQkvHeads,
    RelPosSoftmax,
    RelPosSoftmaxWarp,
    LocalRelPosSoftmax,
    MergeHeads,
    TdtReset,
    TdtDecode,
    TdtScore,
    FeatureFrames,
    PowerSpectrum,
    LogMelNormalize,
    RelPosAttention,
    InjectIllegalAddress,
}

impl Kernel {
    pub(crate) const ALL: [Kernel; 28] = [
        Kernel::F32ToBf16,
        Kernel::Bf16ToF32,
        Kernel::Silu,
        Kernel::Glu,
        Kernel::LayerNorm,
        Kernel::AddLayerNorm,
        Kernel::MaskedSoftmax,
        Kernel::DepthwiseConv1d,
        Kernel::SubsampleConv0Relu,
        Kernel::SubsampleDepthwise,
        Kernel::SubsampleConv0Depthwise,
        Kernel::ReluInplace,
        Kernel::LayerNormF32,
        Kernel::AddLayerNormF32,
        Kernel::AddLayerNormF32Inplace,
        Kernel::SplitQkvHeads,
        Kernel::RelPosSoftmax,
        Kernel::RelPosSoftmaxWarp,
        Kernel::LocalRelPosSoftmax,
        Kernel::MergeHeads,
        Kernel::TdtReset,
        Kernel::TdtDecode,
        Kernel::TdtScore,
        Kernel::FeatureFrames,
        Kernel::PowerSpectrum,
        Kernel::LogMelNormalize,
        Kernel::RelPosAttention,
        Kernel::InjectIllegalAddress,
    ];

    /// The symbol in the compiled module.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kernel::F32ToBf16 => "f32_to_bf16_kernel",
            Kernel::Bf16ToF32 => "bf16_to_f32_kernel",
            Kernel::Silu => "silu_bf16",
            Kernel::Glu => "glu_bf16",
            Kernel::LayerNorm => "layer_norm_bf16",
            Kernel::AddLayerNorm => "add_layer_norm_bf16",
            Kernel::MaskedSoftmax => "masked_softmax_f32_bf16",
            Kernel::DepthwiseConv1d => "depthwise_conv1d_bf16",
            Kernel::SubsampleConv0Relu => "subsample_conv0_relu",
            Kernel::SubsampleDepthwise => "subsample_depthwise",
            Kernel::SubsampleConv0Depthwise => "subsample_conv0_depthwise",
            Kernel::ReluInplace => "relu_bf16_inplace",
            Kernel::LayerNormF32 => "layer_norm_f32_bf16",
            Kernel::AddLayerNormF32 => "add_layer_norm_f32_bf16",
            Kernel::AddLayerNormF32Inplace => "add_layer_norm_f32_inplace",
            Kernel::SplitQkvHeads => "split_qkv_heads",
            Kernel::RelPosSoftmax => "rel_pos_softmax",
            Kernel::RelPosSoftmaxWarp => "rel_pos_softmax_warp",
            Kernel::LocalRelPosSoftmax => "local_rel_pos_softmax",
            Kernel::MergeHeads => "merge_heads",
            Kernel::TdtReset => "tdt_reset",
            Kernel::TdtDecode => "tdt_decode",
            Kernel::TdtScore => "tdt_score",
            Kernel::FeatureFrames => "feature_frames",
            Kernel::PowerSpectrum => "power_spectrum",
            Kernel::LogMelNormalize => "log_mel_normalize",
            Kernel::RelPosAttention => "rel_pos_attention",
            Kernel::InjectIllegalAddress => "inject_illegal_address",
        }
    }

    pub(crate) fn module(self) -> KernelModule {
        match self {
            Kernel::F32ToBf16 | Kernel::Bf16ToF32 | Kernel::InjectIllegalAddress => {
                KernelModule::Convert
            }
            Kernel::Silu | Kernel::Glu => KernelModule::Activation,
            Kernel::LayerNorm | Kernel::AddLayerNorm => KernelModule::LayerNorm,
            Kernel::MaskedSoftmax => KernelModule::Softmax,
            Kernel::DepthwiseConv1d => KernelModule::DepthwiseConv,
            Kernel::SubsampleConv0Relu
            | Kernel::SubsampleDepthwise
            | Kernel::SubsampleConv0Depthwise
            | Kernel::ReluInplace => KernelModule::Subsampling,
            Kernel::LayerNormF32 | Kernel::AddLayerNormF32 | Kernel::AddLayerNormF32Inplace => {
                KernelModule::ResidualNorm
            }
            Kernel::SplitQkvHeads
            | Kernel::RelPosSoftmax
            | Kernel::RelPosSoftmaxWarp
            | Kernel::LocalRelPosSoftmax
            | Kernel::MergeHeads => KernelModule::Attention,
            Kernel::TdtReset | Kernel::TdtDecode | Kernel::TdtScore => KernelModule::Decoder,
            Kernel::FeatureFrames | Kernel::PowerSpectrum | Kernel::LogMelNormalize => {
                KernelModule::Features
            }
            Kernel::RelPosAttention => KernelModule::FusedAttention,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_symbol_is_defined_in_its_module() {
        for kernel in Kernel::ALL {
            let source = kernel.module().source_for(StorageKind::Bf16);
            let declaration = format!("void {}(", kernel.name());
            assert!(
                source.contains(&declaration),
                "{} not found in module {}",
                kernel.name(),
                kernel.module().name()
            );
        }
    }

    #[test]
    fn kernel_table_order_matches_discriminants() {
        for (index, kernel) in Kernel::ALL.iter().enumerate() {
            assert_eq!(*kernel as usize, index);
        }
    }
}

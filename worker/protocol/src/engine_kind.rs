//! Which engine runs a model: the one name every binary, flag and config key uses for it.

use std::fmt;
use std::str::FromStr;

/// The engine kinds. A requested kind that the build or machine cannot provide is an error,
/// never a fallback to another kind: a GPU worker silently running on the CPU would be a wrong
/// fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum EngineKind {
    /// The models crate's CPU f32 reference model (`.nemo`).
    #[cfg_attr(feature = "clap", value(alias = "native"))]
    Cpu,
    /// ONNX Runtime on an export directory (needs `ORT_DYLIB_PATH`).
    Onnx,
    /// The native CUDA engine (bf16 or f32 encoder, GPU decoder in CUDA graphs).
    Cuda,
}

impl EngineKind {
    pub const ALL: [EngineKind; 3] = [Self::Cpu, Self::Onnx, Self::Cuda];

    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Onnx => "onnx",
            Self::Cuda => "cuda",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An engine name that is not `cpu`, `onnx` or `cuda`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine `{0}` (expected cpu, onnx or cuda)")]
pub struct UnknownEngine(pub String);

impl FromStr for EngineKind {
    type Err = UnknownEngine;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownEngine(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_errors() {
        for kind in EngineKind::ALL {
            assert_eq!(kind.name().parse::<EngineKind>(), Ok(kind));
        }
        assert_eq!(
            "gpu".parse::<EngineKind>(),
            Err(UnknownEngine("gpu".into()))
        );
    }
}

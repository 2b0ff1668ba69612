//! The crate's one error type: every CUDA, NVRTC and cuBLASLt failure, with what was being done.

use cudarc::cublaslt::result::CublasError;
use cudarc::driver::DriverError;

/// Every failure of the CUDA layer, with enough context (kernel, shapes) to act on it.
#[derive(Debug, thiserror::Error)]
pub enum CudaEngineError {
    /// No usable CUDA driver, library or device on this machine. Callers that can run elsewhere
    /// (CPU engine, CI) treat this one variant as "not here"; every other variant is a real fault.
    #[error("no CUDA device available: {reason}")]
    NoDevice { reason: String },

    /// A CUDA driver call failed.
    #[error("CUDA driver error while {context}: {source}")]
    Driver {
        context: String,
        #[source]
        source: DriverError,
    },

    /// NVRTC rejected a kernel module (the log says why).
    #[error("NVRTC could not compile kernel module {module} with options {options:?}: {log}")]
    Compile {
        module: &'static str,
        options: Vec<String>,
        log: String,
    },

    /// An NVRTC call other than the compilation itself failed.
    #[error("NVRTC error while {context}: {source}")]
    Nvrtc {
        context: String,
        #[source]
        source: cudarc::nvrtc::result::NvrtcError,
    },

    /// A kernel launch was refused by the driver.
    #[error("launching kernel {kernel} ({shape}): {source}")]
    Launch {
        kernel: &'static str,
        shape: String,
        #[source]
        source: DriverError,
    },

    /// A cuBLASLt call failed (including "no algorithm for this problem").
    #[error("cuBLASLt {call} failed for {shape}: {source}")]
    Cublas {
        call: &'static str,
        shape: String,
        #[source]
        source: CublasError,
    },

    /// Buffers or sizes handed to an operation do not fit together; nothing was launched.
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },

    /// The checkpoint's tensors or config do not fit the encoder (names the file and tensor).
    #[error("loading weights: {0}")]
    Model(#[from] models::ModelError),

    /// The GPU decoder broke one of its own invariants (a bug, never input-driven).
    #[error("TDT decoder on the GPU: {0}")]
    Decoder(String),

    /// Passing shareable device memory between processes failed (the socket, or what came
    /// over it).
    #[error("sharing device memory between processes: {context}: {source}")]
    Sharing {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl CudaEngineError {
    /// The device (or this MPS client's share of it) had no memory for an allocation.
    pub fn is_out_of_memory(&self) -> bool {
        use cudarc::driver::sys::cudaError_enum as E;
        matches!(self, Self::Driver { source, .. } | Self::Launch { source, .. }
            if source.0 == E::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// A fault that poisons the CUDA context for good (an illegal address, a trap, a lost
    /// device, a fatal MPS client fault): the process must exit and its GPU group restart.
    pub fn is_sticky(&self) -> bool {
        use cudarc::driver::sys::cudaError_enum as E;
        let source = match self {
            Self::Driver { source, .. } | Self::Launch { source, .. } => source,
            _ => return false,
        };
        matches!(
            source.0,
            E::CUDA_ERROR_ILLEGAL_ADDRESS
                | E::CUDA_ERROR_LAUNCH_FAILED
                | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
                | E::CUDA_ERROR_MISALIGNED_ADDRESS
                | E::CUDA_ERROR_INVALID_ADDRESS_SPACE
                | E::CUDA_ERROR_INVALID_PC
                | E::CUDA_ERROR_HARDWARE_STACK_ERROR
                | E::CUDA_ERROR_ASSERT
                | E::CUDA_ERROR_ECC_UNCORRECTABLE
                | E::CUDA_ERROR_CONTEXT_IS_DESTROYED
                | E::CUDA_ERROR_DEVICE_UNAVAILABLE
                | E::CUDA_ERROR_MPS_CLIENT_TERMINATED
                | E::CUDA_ERROR_MPS_SERVER_NOT_READY
                | E::CUDA_ERROR_MPS_CONNECTION_FAILED
                | E::CUDA_ERROR_UNKNOWN
        )
    }
}

pub type Result<T, E = CudaEngineError> = std::result::Result<T, E>;

/// Attaches a description of the driver call's purpose to its error.
pub(crate) trait DriverContext<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> DriverContext<T> for Result<T, DriverError> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| CudaEngineError::Driver {
            context: what(),
            source,
        })
    }
}

//! NVRTC: compiling one kernel module's CUDA C to PTX or to a cubin, and the library's version.
//!
//! What the engine hands the driver for each module: PTX, which the driver compiles for the
//! exact SM when loading (and keeps in its JIT cache, so restarts skip that step), or a cubin
//! that NVRTC compiled for the SM itself (`kernel_code.rs` chooses).

use std::ffi::{c_char, c_int, CString};

use cudarc::nvrtc::result::{self as nvrtc, NvrtcError};
use cudarc::nvrtc::Ptx;

use super::context::CudaVersion;
use super::drop_errors::record_drop_error;
use crate::error::{CudaEngineError, Result};

/// The form of every kernel module an engine loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelCode {
    /// PTX for the virtual architecture (`compute_XY`), compiled by the driver.
    Ptx,
    /// A cubin for the exact SM (`sm_XY`), compiled by NVRTC.
    Cubin,
}

/// The version of the NVRTC library loaded.
pub(crate) fn nvrtc_version() -> Result<CudaVersion> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: nvrtcVersion only writes the two ints it is given pointers to.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|source| CudaEngineError::Nvrtc {
            context: "reading the NVRTC version".into(),
            source,
        })?;
    Ok(CudaVersion { major, minor })
}

/// One module as NVRTC produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CompiledModule {
    Ptx(String),
    Cubin(Vec<u8>),
}

impl CompiledModule {
    /// The form `CudaContext::load_module` takes.
    pub(crate) fn into_loadable(self) -> Ptx {
        match self {
            Self::Ptx(text) => Ptx::from_src(text),
            Self::Cubin(bytes) => Ptx::from_binary(bytes),
        }
    }
}

/// One NVRTC program: destroyed on drop, so every exit path releases it.
struct Program(cudarc::nvrtc::sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program came from create_program and is destroyed only here, once. A
        // failure to free it leaks host memory only; it is recorded, not returned.
        let destroyed = unsafe { nvrtc::destroy_program(self.0) };
        record_drop_error("destroying an NVRTC program", destroyed);
    }
}

/// Compiles one module's `source` with `options` (which must include the matching
/// `--gpu-architecture`, see [`arch_option`]) into `code`. The error is NVRTC's log, or the
/// NVRTC call that failed around the compilation.
pub(crate) fn compile(
    source: String,
    name: &str,
    options: &[String],
    code: KernelCode,
) -> std::result::Result<CompiledModule, String> {
    let call = |call: &'static str| move |error: NvrtcError| format!("{call}: {error}");
    let source = CString::new(source).expect("kernel sources contain no NUL (bug)");
    let name = CString::new(name).expect("module names contain no NUL (bug)");
    let program = Program(nvrtc::create_program(&source, Some(&name)).map_err(call("create"))?);
    // SAFETY: `program` is live (destroyed only by its drop, after this function's last use),
    // and the source and name it refers to outlive it.
    if let Err(status) = unsafe { nvrtc::compile_program(program.0, options) } {
        // SAFETY: as above; the log exists after a compilation attempt.
        let log = unsafe { nvrtc::get_program_log(program.0) }
            .map(|raw| c_chars_to_string(&raw))
            .unwrap_or_else(|error| format!("({status}; no log: {error})"));
        return Err(log);
    }
    match code {
        KernelCode::Ptx => {
            // SAFETY: `program` is live and compiled.
            let raw = unsafe { nvrtc::get_ptx(program.0) }.map_err(call("get PTX"))?;
            Ok(CompiledModule::Ptx(c_chars_to_string(&raw)))
        }
        KernelCode::Cubin => {
            let mut size = 0usize;
            // SAFETY: `program` is live and compiled for an `sm_XY` target; the call writes
            // the cubin's size into `size`.
            unsafe { cudarc::nvrtc::sys::nvrtcGetCUBINSize(program.0, &mut size) }
                .result()
                .map_err(call("get cubin size"))?;
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` holds exactly the `size` bytes NVRTC said the cubin has.
            unsafe {
                cudarc::nvrtc::sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast::<c_char>())
            }
            .result()
            .map_err(call("get cubin"))?;
            Ok(CompiledModule::Cubin(cubin))
        }
    }
}

/// The `--gpu-architecture` option for `code` on a device of this compute capability.
pub(crate) fn arch_option(code: KernelCode, (major, minor): (i32, i32)) -> String {
    match code {
        KernelCode::Ptx => format!("--gpu-architecture=compute_{major}{minor}"),
        KernelCode::Cubin => format!("--gpu-architecture=sm_{major}{minor}"),
    }
}

/// NVRTC's NUL-terminated text (PTX, logs) as a `String`.
fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_options_name_the_virtual_or_the_real_architecture() {
        assert_eq!(
            arch_option(KernelCode::Ptx, (9, 0)),
            "--gpu-architecture=compute_90"
        );
        assert_eq!(
            arch_option(KernelCode::Cubin, (8, 6)),
            "--gpu-architecture=sm_86"
        );
    }
}

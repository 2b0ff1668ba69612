//! Loading ONNX Runtime at run time (`ort`'s `load-dynamic`): the library comes from the
//! `onnxruntime` PyPI wheel (or any ONNX Runtime >= 1.20 build), never from a download at
//! build time. One process-wide environment is created on first use.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ort::environment::Environment;

use crate::error::ModelError;

/// The environment variable naming the ONNX Runtime shared library.
pub const ORT_DYLIB_PATH: &str = "ORT_DYLIB_PATH";

/// The library named by `ORT_DYLIB_PATH`, if the variable is set and not empty.
pub fn dylib_from_env() -> Option<PathBuf> {
    std::env::var_os(ORT_DYLIB_PATH)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `explicit` if given, else `ORT_DYLIB_PATH`; the file must exist.
pub fn find_dylib(explicit: Option<&Path>) -> Result<PathBuf, ModelError> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => dylib_from_env().ok_or_else(|| ModelError::OnnxRuntime {
            problem: format!("{ORT_DYLIB_PATH} is not set"),
        })?,
    };
    if !path.is_file() {
        return Err(ModelError::OnnxRuntime {
            problem: format!("{} does not exist or is not a file", path.display()),
        });
    }
    Ok(path)
}

/// The process-wide environment. ONNX Runtime can be loaded only once per process, so the
/// first successful library wins; later calls reuse it whatever path they name.
static ENVIRONMENT: Mutex<Option<Environment>> = Mutex::new(None);

/// Loads ONNX Runtime (once) and returns the shared environment.
pub(crate) fn environment(explicit_dylib: Option<&Path>) -> Result<Environment, ModelError> {
    let mut guard = ENVIRONMENT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(env) = guard.as_ref() {
        return Ok(env.clone());
    }
    let path = find_dylib(explicit_dylib)?;
    let env = ort::init_from(&path)
        .map_err(|e| ModelError::OnnxRuntime {
            problem: e.to_string(),
        })?
        .with_name("parakeet")
        .build()
        .map_err(|e| ModelError::OnnxRuntime {
            problem: format!("{}: creating the environment failed: {e}", path.display()),
        })?;
    tracing::debug!(library = %path.display(), "ONNX Runtime loaded");
    *guard = Some(env.clone());
    Ok(env)
}

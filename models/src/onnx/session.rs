//! One ONNX Runtime session with its input/output signature read from the model, typed errors
//! naming the file, and owned outputs (so callers never hold a borrow of the session).

use std::path::{Path, PathBuf};

use ort::environment::Environment;
use ort::ep;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, Tensor, TensorElementType, ValueType};

use super::options::{ExecutionProvider, OnnxOptions};
use crate::error::ModelError;

/// Element types the transducer graphs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    F32,
    I32,
    I64,
    Other,
}

/// One graph input or output: name, element type and dims (-1 where dynamic).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IoSpec {
    pub(crate) name: String,
    pub(crate) elem: Elem,
    pub(crate) dims: Vec<i64>,
}

impl IoSpec {
    fn from_outlet(name: &str, dtype: &ValueType) -> Self {
        let elem = match dtype.tensor_type() {
            Some(TensorElementType::Float32) => Elem::F32,
            Some(TensorElementType::Int32) => Elem::I32,
            Some(TensorElementType::Int64) => Elem::I64,
            _ => Elem::Other,
        };
        let dims = dtype.tensor_shape().map(|s| s.to_vec()).unwrap_or_default();
        Self {
            name: name.to_string(),
            elem,
            dims,
        }
    }

    /// Whether dimension `axis` is fixed to `size` in the graph.
    pub(crate) fn fixed(&self, axis: usize, size: i64) -> bool {
        self.dims.get(axis) == Some(&size)
    }

    pub(crate) fn describe(&self) -> String {
        format!("{}: {:?} {:?}", self.name, self.elem, self.dims)
    }
}

/// A value for one input, built from owned row-major data.
#[derive(Debug, Clone)]
pub(crate) enum Input {
    F32(Vec<usize>, Vec<f32>),
    I32(Vec<usize>, Vec<i32>),
    I64(Vec<usize>, Vec<i64>),
}

/// One output copied out of ONNX Runtime.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Output {
    pub(crate) shape: Vec<usize>,
    pub(crate) data: OutputData,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OutputData {
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
}

/// A loaded ONNX model. `run` needs `&mut self` (ort 2.0), so one session per engine thread;
/// it is `Send` and may move between threads.
pub(crate) struct OnnxSession {
    session: Session,
    file: PathBuf,
    pub(crate) inputs: Vec<IoSpec>,
    pub(crate) outputs: Vec<IoSpec>,
}

impl std::fmt::Debug for OnnxSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxSession")
            .field("file", &self.file)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .finish_non_exhaustive()
    }
}

impl OnnxSession {
    /// Opens `file` with the execution provider `opts` asks for. A GPU provider that cannot be
    /// registered is an error, never a silent CPU fallback.
    pub(crate) fn open(
        env: &Environment,
        file: &Path,
        opts: &OnnxOptions,
    ) -> Result<Self, ModelError> {
        let fail = |problem: String| ModelError::Onnx {
            file: file.to_path_buf(),
            problem,
        };
        let mut builder = Session::builder(env)
            .map_err(|e| fail(format!("creating session options: {e}")))?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(|e| fail(format!("setting the optimization level: {e}")))?;
        if let Some(threads) = opts.intra_threads {
            builder = builder
                .with_intra_threads(threads)
                .map_err(|e| fail(format!("setting {threads} intra-op threads: {e}")))?;
        }
        let providers = match opts.execution_provider {
            ExecutionProvider::Cpu => vec![ep::CPU::default().build().error_on_failure()],
            ExecutionProvider::Cuda { device_id } => vec![ep::CUDA::default()
                .with_device_id(device_id)
                .build()
                .error_on_failure()],
            ExecutionProvider::TensorRt { device_id } => vec![
                ep::TensorRT::default()
                    .with_device_id(device_id)
                    .build()
                    .error_on_failure(),
                // TensorRT hands the nodes it cannot compile to CUDA, as its docs recommend.
                ep::CUDA::default()
                    .with_device_id(device_id)
                    .build()
                    .error_on_failure(),
            ],
        };
        let provider_names: Vec<&str> = providers.iter().map(|p| p.name()).collect();
        let unavailable = |e: ort::Error<_>| {
            fail(format!(
                "execution provider {provider_names:?} unavailable: {e} (the CPU-only \
                 onnxruntime wheel has none; use onnxruntime-gpu for CUDA/TensorRT)"
            ))
        };
        builder = builder
            .with_no_environment_execution_providers()
            .map_err(unavailable)?
            .with_execution_providers(&providers)
            .map_err(unavailable)?;
        let session = builder
            .commit_from_file(file)
            .map_err(|e| fail(format!("loading the model: {e}")))?;
        let inputs = session
            .inputs()
            .iter()
            .map(|o| IoSpec::from_outlet(o.name(), o.dtype()))
            .collect();
        let outputs = session
            .outputs()
            .iter()
            .map(|o| IoSpec::from_outlet(o.name(), o.dtype()))
            .collect();
        Ok(Self {
            session,
            file: file.to_path_buf(),
            inputs,
            outputs,
        })
    }

    pub(crate) fn error(&self, problem: impl Into<String>) -> ModelError {
        ModelError::Onnx {
            file: self.file.clone(),
            problem: problem.into(),
        }
    }

    /// A custom metadata property (`metadata_props` in the ONNX file).
    pub(crate) fn metadata(&self, key: &str) -> Option<String> {
        self.session.metadata().ok()?.custom(key)
    }

    /// The signature in one line, for error messages.
    pub(crate) fn describe_io(&self) -> String {
        let list = |specs: &[IoSpec]| {
            specs
                .iter()
                .map(IoSpec::describe)
                .collect::<Vec<_>>()
                .join("; ")
        };
        format!(
            "inputs [{}], outputs [{}]",
            list(&self.inputs),
            list(&self.outputs)
        )
    }

    /// Runs the graph with one value per input (in `self.inputs` order) and copies every output.
    pub(crate) fn run(&mut self, inputs: Vec<Input>) -> Result<Vec<Output>, ModelError> {
        if inputs.len() != self.inputs.len() {
            return Err(self.error(format!(
                "{} inputs given, the graph has {}",
                inputs.len(),
                self.inputs.len()
            )));
        }
        let mut values: Vec<(String, SessionInputValue<'static>)> =
            Vec::with_capacity(inputs.len());
        for (spec, input) in self.inputs.iter().zip(inputs) {
            let value = to_value(input).map_err(|e| ModelError::Onnx {
                file: self.file.clone(),
                problem: format!("input `{}`: {e}", spec.name),
            })?;
            values.push((spec.name.clone(), value.into()));
        }
        let file = self.file.clone();
        let outputs = self.session.run(values).map_err(|e| ModelError::Onnx {
            file: file.clone(),
            problem: format!("running the graph: {e}"),
        })?;
        let mut copied = Vec::with_capacity(outputs.len());
        for (name, value) in outputs.iter() {
            copied.push(copy_output(&value).map_err(|problem| ModelError::Onnx {
                file: file.clone(),
                problem: format!("output `{name}`: {problem}"),
            })?);
        }
        Ok(copied)
    }
}

fn to_value(input: Input) -> ort::Result<DynValue> {
    Ok(match input {
        Input::F32(shape, data) => Tensor::from_array((shape, data))?.into_dyn(),
        Input::I32(shape, data) => Tensor::from_array((shape, data))?.into_dyn(),
        Input::I64(shape, data) => Tensor::from_array((shape, data))?.into_dyn(),
    })
}

fn copy_output(value: &DynValue) -> Result<Output, String> {
    let shape_of = |dims: &[i64]| -> Result<Vec<usize>, String> {
        dims.iter()
            .map(|d| usize::try_from(*d).map_err(|_| format!("negative dimension in {dims:?}")))
            .collect()
    };
    match value.dtype().tensor_type() {
        Some(TensorElementType::Float32) => {
            let (shape, data) = value
                .try_extract_tensor::<f32>()
                .map_err(|e| e.to_string())?;
            Ok(Output {
                shape: shape_of(shape)?,
                data: OutputData::F32(data.to_vec()),
            })
        }
        Some(TensorElementType::Int64) => {
            let (shape, data) = value
                .try_extract_tensor::<i64>()
                .map_err(|e| e.to_string())?;
            Ok(Output {
                shape: shape_of(shape)?,
                data: OutputData::I64(data.to_vec()),
            })
        }
        Some(TensorElementType::Int32) => {
            let (shape, data) = value
                .try_extract_tensor::<i32>()
                .map_err(|e| e.to_string())?;
            Ok(Output {
                shape: shape_of(shape)?,
                data: OutputData::I32(data.to_vec()),
            })
        }
        other => Err(format!("unsupported element type {other:?}")),
    }
}

impl Output {
    /// The data as f32, or an error naming what it was.
    pub(crate) fn f32(&self) -> Result<&[f32], String> {
        match &self.data {
            OutputData::F32(d) => Ok(d),
            other => Err(format!("expected f32 data, got {}", other.kind())),
        }
    }

    /// Integer data (lengths) as i64.
    pub(crate) fn int(&self) -> Result<Vec<i64>, String> {
        match &self.data {
            OutputData::I64(d) => Ok(d.clone()),
            OutputData::I32(d) => Ok(d.iter().map(|v| i64::from(*v)).collect()),
            other => Err(format!("expected integer data, got {}", other.kind())),
        }
    }
}

impl OutputData {
    fn kind(&self) -> &'static str {
        match self {
            OutputData::F32(_) => "f32",
            OutputData::I64(_) => "i64",
            OutputData::I32(_) => "i32",
        }
    }
}

//! `dispatcher transcribe`: local audio files through an in-process engine on the CPU, one
//! document per file, to stdout or `--out DIR/<stem>.<ext>`.
//!
//! The model is loaded once. Each file is decoded by the `audio` crate (any supported container,
//! resampled to 16 kHz mono), cut into segments of at most `--max-segment-secs` at quiet points,
//! transcribed a few segments per call, and the segment transcripts are joined. A file that
//! fits in one segment keeps NeMo's transcript exactly as computed. A failing file is reported
//! with its name and the others still run; the exit status is non-zero if any failed.
//!
//! With `--diarize --diar-model PATH`, the diarization model runs over each whole recording
//! on a second thread while the transcription runs; words and segments get speaker labels
//! (verbose_json, srt, vtt) and `--format rttm` prints the speaker turns.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use clap::ValueEnum;
use dispatcher::diarizer::Diarizer;
use dispatcher::transcriber::{stitch, Piece};
use model_core::render::{render, OutputFormat, RenderOptions};
use model_core::speakers::{attribute_speakers, AttributionOptions, SpeakerSegment};
use model_core::timestamps::{FrameTiming, TimestampOptions, Timestamper};
use model_core::transcript::Transcript;
use models::onnx::{OnnxModel, OnnxOptions};
use models::ParakeetModel;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum EngineKind {
    /// The plain-Rust f32 reference model, from a `.nemo` file.
    Native,
    /// ONNX Runtime (CPU) on an export directory; needs `ORT_DYLIB_PATH`.
    Onnx,
    /// The native CUDA engine on GPU 0 (bf16 or f32 encoder, GPU decoder), from a `.nemo` file.
    /// Without a usable GPU this is an error, never a fallback to the CPU.
    Cuda,
}

/// The CUDA engine's encoder storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CudaPrecision {
    /// bf16 weights and activations, fp32 accumulation (fast).
    Bf16,
    /// f32 throughout: NeMo's fp32 results.
    F32,
}

#[derive(Debug, clap::Args)]
pub(crate) struct TranscribeArgs {
    /// The model: a `.nemo` file (native engine) or an ONNX export directory (onnx engine).
    #[arg(long, env = "PARAKEET_MODEL")]
    pub(crate) model: PathBuf,
    /// Output document format: json, verbose_json, text, srt, vtt, or rttm (with --diarize).
    #[arg(long, default_value_t = OutputFormat::Json)]
    pub(crate) format: OutputFormat,
    /// Say who spoke: speaker labels in verbose_json, srt and vtt; needs --diar-model.
    #[arg(long)]
    pub(crate) diarize: bool,
    /// The diarization model: a Streaming Sortformer `.nemo` file.
    #[arg(long, env = "DIAR_MODEL")]
    pub(crate) diar_model: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = EngineKind::Native)]
    pub(crate) engine: EngineKind,
    /// Encoder storage of `--engine cuda`.
    #[arg(long, value_enum, default_value_t = CudaPrecision::Bf16)]
    pub(crate) cuda_precision: CudaPrecision,
    /// Write `<DIR>/<file stem>.<ext>` per input instead of printing to stdout.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// `language` written into verbose_json (e.g. `english`); omitted when not given.
    #[arg(long)]
    pub(crate) language: Option<String>,
    /// Longest piece of audio given to the model at once; longer files are cut at quiet points.
    #[arg(long, default_value_t = 30.0)]
    pub(crate) max_segment_secs: f64,
    /// Segments transcribed together in one batch.
    #[arg(long, default_value_t = 4)]
    pub(crate) segments_per_call: usize,
    /// Audio files to transcribe.
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
}

/// A loaded model and the timestamp pass for its vocabulary.
enum Engine {
    Native(ParakeetModel),
    Onnx(OnnxModel),
    Cuda(Box<cuda_engine::GpuParakeet>),
}

impl Engine {
    fn load(
        kind: EngineKind,
        path: &Path,
        precision: CudaPrecision,
    ) -> anyhow::Result<(Self, Timestamper)> {
        let started = std::time::Instant::now();
        let loaded = match kind {
            EngineKind::Native => {
                let model = ParakeetModel::load(path)?;
                let timestamper = Timestamper::for_model(model.vocabulary(), model.config());
                (Engine::Native(model), timestamper)
            }
            EngineKind::Onnx => {
                let model = OnnxModel::load(path, &OnnxOptions::default())?;
                let timestamper = Timestamper::new(
                    model.vocabulary(),
                    onnx_frame_timing(&model),
                    TimestampOptions::default(),
                );
                (Engine::Onnx(model), timestamper)
            }
            EngineKind::Cuda => {
                let precision = match precision {
                    CudaPrecision::Bf16 => cuda_engine::EncoderPrecision::Bf16,
                    CudaPrecision::F32 => cuda_engine::EncoderPrecision::F32,
                };
                let model = cuda_engine::GpuParakeet::load_with(path, 0, precision)?;
                let timestamper = Timestamper::for_model(model.vocabulary(), model.config());
                (Engine::Cuda(Box::new(model)), timestamper)
            }
        };
        tracing::info!(model = %path.display(), load_s = started.elapsed().as_secs_f64(), "model loaded");
        Ok(loaded)
    }

    fn transcribe_batch(
        &mut self,
        pcm: &[&[f32]],
    ) -> anyhow::Result<Vec<model_core::transcript::Hypothesis>> {
        Ok(match self {
            Engine::Native(m) => m.transcribe_batch(pcm)?,
            Engine::Onnx(m) => m.transcribe_batch(pcm)?,
            Engine::Cuda(m) => m.transcribe_batch(pcm)?,
        })
    }
}

/// An ONNX export has no `window_stride`; take it from the feature settings when the Rust
/// extractor computes the features, else NeMo's 10 ms hop.
fn onnx_frame_timing(model: &OnnxModel) -> FrameTiming {
    let sample_rate_hz = audio::TARGET_SAMPLE_RATE_HZ;
    let window_stride_s = model.feature_config().map_or(0.01, |f| {
        f.hop_length_samples as f64 / f64::from(f.sample_rate_hz)
    });
    let subsampling_factor = (model.seconds_per_encoder_frame() / window_stride_s)
        .round()
        .max(1.0) as usize;
    FrameTiming {
        window_stride_s,
        subsampling_factor,
        sample_rate_hz,
    }
}

struct Transcribing<'a> {
    engine: Engine,
    timestamper: Timestamper,
    diarizer: Option<Arc<dyn Diarizer>>,
    args: &'a TranscribeArgs,
}

impl Transcribing<'_> {
    /// The file's transcript, and its speaker turns when diarizing (speakers attributed).
    fn file(&mut self, path: &Path) -> anyhow::Result<(Transcript, Vec<SpeakerSegment>)> {
        let bytes = std::fs::read(path).context("reading")?;
        let ext = path.extension().and_then(|e| e.to_str());
        let decoded = audio::decode(&bytes, ext, &audio::AudioLimits::default())?;
        let pcm = decoded.pcm_16k.as_slice();
        let diarizer = self.diarizer.clone();
        let (mut transcript, turns) = std::thread::scope(|scope| {
            let diarization = diarizer.map(|d| scope.spawn(move || d.diarize(pcm)));
            let transcript = self.transcript(pcm, decoded.duration_secs);
            let turns = match diarization {
                Some(handle) => Some(
                    handle
                        .join()
                        .map_err(|_| anyhow!("diarization thread panicked"))?
                        .context("diarizing")?,
                ),
                None => None,
            };
            anyhow::Ok((transcript?, turns))
        })?;
        let Some(turns) = turns else {
            return Ok((transcript, Vec::new()));
        };
        attribute_speakers(&mut transcript, &turns, &AttributionOptions::default());
        Ok((transcript, turns))
    }

    fn transcript(&mut self, pcm_16k: &[f32], duration_secs: f64) -> anyhow::Result<Transcript> {
        let segmenter = audio::SegmenterConfig {
            max_segment_secs: self.args.max_segment_secs,
            ..audio::SegmenterConfig::default()
        };
        let segments: Vec<audio::Segment<'_>> = audio::segments(pcm_16k, &segmenter).collect();
        let rate = f64::from(audio::TARGET_SAMPLE_RATE_HZ);
        let frame_s = self.timestamper.timing().seconds(1);
        let mut pieces = Vec::with_capacity(segments.len());
        for batch in segments.chunks(self.args.segments_per_call.max(1)) {
            let pcm: Vec<&[f32]> = batch.iter().map(|s| s.samples).collect();
            let hyps = self.engine.transcribe_batch(&pcm)?;
            if hyps.len() != batch.len() {
                bail!(
                    "{} hypotheses for {} segments (bug)",
                    hyps.len(),
                    batch.len()
                );
            }
            for (segment, hyp) in batch.iter().zip(&hyps) {
                let transcript = self.timestamper.transcript(hyp, segment.samples.len())?;
                let offset_s = segment.start_sample as f64 / rate;
                pieces.push(Piece {
                    offset_s,
                    offset_frames: (offset_s / frame_s).round() as usize,
                    transcript,
                });
            }
        }
        if pieces.len() == 1 && pieces[0].offset_s == 0.0 {
            // One segment from the start: NeMo's transcript untouched (no re-joined text).
            if let Some(only) = pieces.pop() {
                return Ok(Transcript {
                    duration_s: duration_secs,
                    ..only.transcript
                });
            }
        }
        Ok(stitch(pieces, duration_secs))
    }
}

/// `<dir>/<stem>.<ext>` per input; two inputs with the same stem would overwrite each other.
fn output_paths(
    dir: &Path,
    files: &[PathBuf],
    format: OutputFormat,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut seen: BTreeMap<PathBuf, &Path> = BTreeMap::new();
    let mut paths = Vec::with_capacity(files.len());
    for file in files {
        let stem = file
            .file_stem()
            .map_or_else(|| "audio".into(), |s| s.to_string_lossy().into_owned());
        let path = dir.join(format!("{stem}.{}", format.extension()));
        if let Some(other) = seen.insert(path.clone(), file) {
            bail!(
                "{} and {} would both be written to {}",
                other.display(),
                file.display(),
                path.display()
            );
        }
        paths.push(path);
    }
    Ok(paths)
}

pub(crate) fn run(args: TranscribeArgs) -> anyhow::Result<()> {
    let format = args.format;
    if format.needs_diarization() && !args.diarize {
        bail!("--format {format} needs --diarize");
    }
    let diarizer = match (args.diarize, &args.diar_model) {
        (false, _) => None,
        (true, None) => bail!("--diarize needs --diar-model PATH (or DIAR_MODEL)"),
        (true, Some(path)) => Some(
            dispatcher::diarizer::load(path, None)
                .with_context(|| format!("loading diarization model {}", path.display()))?,
        ),
    };
    let out_paths = match &args.out {
        Some(dir) => {
            let paths = output_paths(dir, &args.files, format)?;
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            Some(paths)
        }
        None => None,
    };
    let (engine, timestamper) = Engine::load(args.engine, &args.model, args.cuda_precision)
        .with_context(|| format!("loading model {}", args.model.display()))?;
    let mut job = Transcribing {
        engine,
        timestamper,
        diarizer,
        args: &args,
    };

    let several_to_stdout = out_paths.is_none() && args.files.len() > 1;
    let mut failed = 0;
    for (k, file) in args.files.iter().enumerate() {
        let started = std::time::Instant::now();
        let result = job.file(file).and_then(|(transcript, speaker_turns)| {
            let options = RenderOptions {
                language: args.language.clone(),
                file_id: file.file_stem().map(|s| s.to_string_lossy().into_owned()),
                speaker_turns,
            };
            let doc = render(&transcript, format, &options);
            match &out_paths {
                Some(paths) => std::fs::write(&paths[k], doc)
                    .with_context(|| format!("writing {}", paths[k].display())),
                None => {
                    let mut stdout = std::io::stdout().lock();
                    if several_to_stdout {
                        // Like `head` with several files: a header names each document.
                        let gap = if k > 0 { "\n" } else { "" };
                        writeln!(stdout, "{gap}==> {} <==", file.display())?;
                    }
                    stdout.write_all(doc.as_bytes())?;
                    stdout.flush().context("writing to stdout")
                }
            }
        });
        match result {
            Ok(()) => {
                tracing::info!(file = %file.display(), secs = started.elapsed().as_secs_f64(), "transcribed")
            }
            Err(e) => {
                failed += 1;
                eprintln!("{}: {e:#}", file.display());
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} files failed", args.files.len());
    }
    Ok(())
}

//! `dispatcher transcribe`: local audio files through an in-process engine (cpu, onnx or cuda), one
//! document per file, to stdout or `--out DIR/<stem>.<ext>`.
//!
//! The model is loaded once. Each file is decoded by the `audio` crate (any supported container,
//! resampled to 16 kHz mono), cut into segments of at most `--max-segment-s` at quiet points,
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

use anyhow::{bail, Context};
use dispatcher::decode::{decode_segments, AudioSettings};
use dispatcher::diarizer::Diarizer;
use dispatcher::fleet_engine::CudaPrecision;
use dispatcher::in_process;
use dispatcher::recording::{transcribe_recording, RecordingResult};
use dispatcher::transcriber::Capacity;
use dispatcher::transcriber::{Priority, Transcriber};
use engine::{EngineKind, EngineSettings};
use model_core::long_audio::{LongAudio, DEFAULT_FULL_ATTENTION_MAX_S};
use model_core::render::{render, OutputFormat, RenderOptions, MODEL_LANGUAGE};

#[derive(Debug, clap::Args)]
pub(crate) struct TranscribeArgs {
    /// The model: a `.nemo` file (cpu and cuda engines) or an ONNX export directory (onnx).
    #[arg(long)]
    pub(crate) model: PathBuf,
    /// Output document format (`rttm`: the speaker turns, with --diarize).
    #[arg(long, default_value_t = OutputFormat::Json, value_parser = super::output_format())]
    pub(crate) format: OutputFormat,
    /// Say who spoke: speaker labels in verbose_json, srt and vtt; needs --diar-model.
    #[arg(long)]
    pub(crate) diarize: bool,
    /// The diarization model: a Streaming Sortformer `.nemo` file.
    #[arg(long)]
    pub(crate) diar_model: Option<PathBuf>,
    /// The engine: `cpu` (the f32 reference model), `onnx` (ONNX Runtime on its CPU provider;
    /// needs `ORT_DYLIB_PATH`) or `cuda` (the native GPU engine; without a usable GPU this is an
    /// error, never a fallback to the CPU). Diarization runs on `cpu` or `cuda`.
    #[arg(long, value_enum, default_value_t = EngineKind::Cpu)]
    pub(crate) engine: EngineKind,
    /// The GPU of `--engine cuda` (ordinal after `CUDA_VISIBLE_DEVICES`).
    #[arg(long, default_value_t = 0)]
    pub(crate) cuda_device: usize,
    /// The CUDA engine's encoder storage.
    #[arg(long, value_enum, default_value_t)]
    pub(crate) cuda_encoder_precision: CudaPrecision,
    /// Utterances longer than this (seconds) run with local attention (128 encoder frames,
    /// 10.24 s, each side) instead of the checkpoint's full attention: NeMo's long-audio
    /// recipe. 1440 (24 minutes) is the model card's full-attention limit; every engine uses
    /// the same value, so a transcript does not depend on the engine.
    #[arg(long, default_value_t = DEFAULT_FULL_ATTENTION_MAX_S, value_parser = cli::positive_seconds)]
    pub(crate) full_attention_max_s: f64,
    /// Write `<DIR>/<file stem>.<ext>` per input instead of printing to stdout.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// `language` written into verbose_json (OpenAI writes the language's name, e.g. `english`).
    #[arg(long, default_value = MODEL_LANGUAGE)]
    pub(crate) language: String,
    /// Longest piece of audio given to the model at once (seconds); longer recordings are
    /// cut at quiet points into pieces no longer than this. The default, full attention's 24
    /// minutes, runs every recording up to that length in one pass, as NeMo's transcribe() does;
    /// raise it to run longer ones in one pass too (local attention beyond
    /// `full_attention_max_s`), or lower it to 30 for the short pieces that batch best.
    #[arg(long, default_value_t = DEFAULT_FULL_ATTENTION_MAX_S)]
    pub(crate) max_segment_s: f64,
    /// Segments transcribed together in one batch.
    #[arg(long, default_value_t = Capacity::ONE_CALL_AT_A_TIME.segments_per_call)]
    pub(crate) segments_per_call: usize,
    /// Audio files to transcribe.
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
}

impl TranscribeArgs {
    fn engine_settings(&self) -> EngineSettings {
        let settings = match self.engine {
            EngineKind::Cpu | EngineKind::Onnx => EngineSettings::cpu(),
            EngineKind::Cuda => EngineSettings::gpu(
                self.cuda_device,
                self.cuda_encoder_precision.encoder(),
                self.segments_per_call,
            ),
        };
        EngineSettings {
            long_audio: LongAudio {
                full_attention_max_s: self.full_attention_max_s,
            },
            ..settings
        }
    }
}

struct Transcribing<'a> {
    transcriber: Arc<dyn Transcriber>,
    diarizer: Option<Arc<dyn Diarizer>>,
    audio: AudioSettings,
    args: &'a TranscribeArgs,
}

impl Transcribing<'_> {
    /// The file's transcript, and its speaker turns when diarizing (speakers attributed).
    fn file(&self, path: &Path) -> anyhow::Result<RecordingResult> {
        let bytes = std::fs::read(path).context("reading")?;
        let ext = path.extension().and_then(|e| e.to_str());
        let decoded = decode_segments(&bytes, ext, &self.audio)?;
        Ok(transcribe_recording(
            self.transcriber.as_ref(),
            self.diarizer.as_deref(),
            &decoded,
            self.args.segments_per_call,
            Priority::Batch,
            None,
        )?)
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
    dispatcher::config::check_max_segment_s(args.max_segment_s)?;
    let settings = args.engine_settings();
    // Ids name results in a store; printed documents need none, so no model file is hashed.
    let id_of = |path: &Path| Some(path.display().to_string());
    let diarizer = match (args.diarize, &args.diar_model) {
        (false, _) => None,
        (true, None) => bail!("--diarize needs --diar-model PATH (or PARAKEET_DIAR_MODEL)"),
        (true, Some(path)) => Some(
            in_process::load_diarizer(args.engine, path, &settings, id_of(path))
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
    let transcriber =
        in_process::load_transcriber(args.engine, &args.model, &settings, id_of(&args.model))?;
    let mut audio = AudioSettings::default();
    audio.segmenter.max_segment_s = args.max_segment_s;
    let job = Transcribing {
        transcriber,
        diarizer,
        audio,
        args: &args,
    };

    let several_to_stdout = out_paths.is_none() && args.files.len() > 1;
    let mut failed = 0;
    for (k, file) in args.files.iter().enumerate() {
        let started = std::time::Instant::now();
        let result = job.file(file).and_then(|recording| {
            let options = RenderOptions {
                language: Some(args.language.clone()),
                file_id: file.file_stem().map(|s| s.to_string_lossy().into_owned()),
                speaker_turns: recording.speaker_turns.unwrap_or_default(),
                ..RenderOptions::default()
            };
            let doc = render(&recording.transcript, format, &options);
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

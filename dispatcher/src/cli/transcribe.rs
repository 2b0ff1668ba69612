//! `dispatcher transcribe`: local files through the in-process engine.

use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub(crate) struct TranscribeArgs {
    /// The model: a `.nemo` file (native engine) or an ONNX export directory (onnx engine).
    #[arg(long, env = "PARAKEET_MODEL")]
    pub(crate) model: PathBuf,
    /// Audio files to transcribe.
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
}

pub(crate) fn run(args: TranscribeArgs) -> anyhow::Result<()> {
    anyhow::bail!(
        "transcription is not wired yet ({} files, model {})",
        args.files.len(),
        args.model.display()
    )
}

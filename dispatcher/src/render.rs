//! Transcript to each output format's document (the models crate's renderers).

use models::render::{OutputFormat as ModelFormat, RenderOptions};
use models::transcript::Transcript;

use crate::error::Result;
use crate::job::OutputFormat;

fn model_format(format: OutputFormat) -> ModelFormat {
    match format {
        OutputFormat::Json => ModelFormat::Json,
        OutputFormat::VerboseJson => ModelFormat::VerboseJson,
        OutputFormat::Text => ModelFormat::Text,
        OutputFormat::Srt => ModelFormat::Srt,
        OutputFormat::Vtt => ModelFormat::Vtt,
    }
}

pub fn render(format: OutputFormat, transcript: &Transcript) -> Result<String> {
    Ok(models::render::render(
        transcript,
        model_format(format),
        &RenderOptions::default(),
    ))
}

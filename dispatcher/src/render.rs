//! Transcript to each output format's document (the models crate's renderers).

use model_core::render::RenderOptions;
use model_core::transcript::Transcript;

use crate::error::Result;
use crate::job::OutputFormat;

pub fn render(format: OutputFormat, transcript: &Transcript) -> Result<String> {
    render_with(format, transcript, &RenderOptions::default())
}

/// With what the transcript does not know: the recording's name and the speaker turns (rttm).
pub fn render_with(
    format: OutputFormat,
    transcript: &Transcript,
    options: &RenderOptions,
) -> Result<String> {
    Ok(model_core::render::render(transcript, format, options))
}

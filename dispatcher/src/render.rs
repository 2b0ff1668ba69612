//! Transcript to each output format's document (the models crate's renderers).

use models::render::RenderOptions;
use models::transcript::Transcript;

use crate::error::Result;
use crate::job::OutputFormat;

pub fn render(format: OutputFormat, transcript: &Transcript) -> Result<String> {
    Ok(models::render::render(
        transcript,
        format,
        &RenderOptions::default(),
    ))
}

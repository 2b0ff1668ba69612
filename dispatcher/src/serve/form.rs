//! The multipart form of `POST /v1/audio/transcriptions`, as OpenAI defines it, read and
//! checked before any decoding.

use axum::extract::multipart::{Multipart, MultipartError};
use axum::http::StatusCode;
use bytes::Bytes;
use model_core::render::{OutputFormat, MODEL_LANGUAGE};

use super::error::ApiError;

/// Which timestamps `verbose_json` carries (OpenAI's `timestamp_granularities[]`; segments by
/// default, words only when asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Granularities {
    pub words: bool,
    pub segments: bool,
}

impl Default for Granularities {
    fn default() -> Self {
        Self {
            words: false,
            segments: true,
        }
    }
}

/// A checked transcription request.
#[derive(Debug)]
pub(super) struct TranscriptionForm {
    pub(super) file: Bytes,
    /// The upload's file name, whose extension orders the decoder's probe.
    pub file_name: Option<String>,
    pub model: String,
    pub response_format: OutputFormat,
    pub granularities: Granularities,
    /// Given and checked against what the model speaks.
    pub language: Option<String>,
    /// Extension: speaker labels in verbose_json/srt/vtt, and `rttm`.
    pub diarize: bool,
}

/// The languages Parakeet TDT 0.6B v2 transcribes, as ISO-639-1 codes and OpenAI's names.
const LANGUAGES: [(&str, &str); 1] = [("en", MODEL_LANGUAGE)];

/// OpenAI's `verbose_json` writes the language's name.
pub(super) fn language_name(code_or_name: &str) -> Option<&'static str> {
    let wanted = code_or_name.trim().to_ascii_lowercase();
    LANGUAGES
        .iter()
        .find(|(code, name)| wanted == *code || wanted == *name)
        .map(|(_, name)| *name)
}

fn form_error(e: MultipartError) -> ApiError {
    let status = e.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(
            status,
            "too_large",
            format!(
                "the request is larger than this server takes: {}",
                e.body_text()
            ),
        );
    }
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_multipart",
        format!(
            "the request body is not a readable multipart form: {}",
            e.body_text()
        ),
    )
}

async fn text_of(field: axum::extract::multipart::Field<'_>) -> Result<String, ApiError> {
    field.text().await.map_err(form_error)
}

impl TranscriptionForm {
    /// Reads every field; unknown fields are skipped (clients send OpenAI's newer ones).
    pub(super) async fn read(mut multipart: Multipart) -> Result<Self, ApiError> {
        let mut file = None;
        let mut file_name = None;
        let mut model = None;
        let mut response_format = None;
        let mut granularities: Option<Granularities> = None;
        let mut language = None;
        let mut diarize = false;
        let mut stream = false;
        while let Some(field) = multipart.next_field().await.map_err(form_error)? {
            let name = field.name().unwrap_or_default().to_owned();
            match name.as_str() {
                "file" => {
                    file_name = field.file_name().map(str::to_owned);
                    file = Some(field.bytes().await.map_err(form_error)?);
                }
                "model" => model = Some(text_of(field).await?),
                "response_format" => {
                    let value = text_of(field).await?;
                    response_format = Some(value.parse::<OutputFormat>().map_err(|_| {
                        ApiError::invalid(
                            "response_format",
                            "invalid_response_format",
                            format!(
                                "response_format `{value}` is not one of json, text, srt, \
                                 verbose_json, vtt (or rttm with diarize)"
                            ),
                        )
                    })?);
                }
                "timestamp_granularities[]" | "timestamp_granularities" => {
                    let value = text_of(field).await?;
                    let g = granularities.get_or_insert(Granularities {
                        words: false,
                        segments: false,
                    });
                    match value.as_str() {
                        "word" => g.words = true,
                        "segment" => g.segments = true,
                        other => {
                            return Err(ApiError::invalid(
                                "timestamp_granularities[]",
                                "invalid_timestamp_granularity",
                                format!("timestamp granularity `{other}` is not word or segment"),
                            ))
                        }
                    }
                }
                "language" => language = Some(text_of(field).await?),
                "diarize" => {
                    let value = text_of(field).await?;
                    diarize = match value.trim() {
                        "true" | "1" => true,
                        "false" | "0" | "" => false,
                        other => {
                            return Err(ApiError::invalid(
                                "diarize",
                                "invalid_diarize",
                                format!("diarize is `{other}`; send true or false"),
                            ))
                        }
                    };
                }
                "stream" => stream = text_of(field).await?.trim() == "true",
                // prompt, temperature, include[], chunking_strategy, ...: decoding is greedy
                // and takes no prompt, so they change nothing.
                _ => {}
            }
        }
        if stream {
            return Err(ApiError::invalid(
                "stream",
                "streaming_unsupported",
                "streamed transcription is not supported; leave stream unset",
            ));
        }
        let file = file.ok_or_else(|| {
            ApiError::invalid("file", "missing_file", "the form has no `file` field")
        })?;
        let model = model.ok_or_else(|| {
            ApiError::invalid(
                "model",
                "missing_model",
                "the form has no `model` field (GET /v1/models lists the names)",
            )
        })?;
        let response_format = response_format.unwrap_or(OutputFormat::Json);
        if granularities.is_some() && response_format != OutputFormat::VerboseJson {
            return Err(ApiError::invalid(
                "timestamp_granularities[]",
                "granularities_need_verbose_json",
                "timestamp_granularities[] needs response_format verbose_json",
            ));
        }
        if let Some(lang) = &language {
            if language_name(lang).is_none() {
                return Err(ApiError::invalid(
                    "language",
                    "unsupported_language",
                    format!("language `{lang}` is not one this model transcribes (en)"),
                ));
            }
        }
        if response_format.needs_diarization() && !diarize {
            return Err(ApiError::invalid(
                "response_format",
                "rttm_needs_diarize",
                "response_format rttm needs diarize=true",
            ));
        }
        Ok(Self {
            file,
            file_name,
            model,
            response_format,
            granularities: granularities.unwrap_or_default(),
            language,
            diarize,
        })
    }

    /// The upload's extension, lower case, as a probe hint.
    pub(super) fn extension(&self) -> Option<String> {
        let name = self.file_name.as_deref()?;
        let (_, ext) = name.rsplit_once('.')?;
        (!ext.is_empty() && ext.len() <= 8).then(|| ext.to_ascii_lowercase())
    }
}

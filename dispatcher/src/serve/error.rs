//! Errors as OpenAI's API shapes them: a status code and
//! `{"error": {"message", "type", "param", "code"}}`, so clients raise their usual exceptions.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::DispatchError;

/// One failed request: what the client sees.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The form field at fault, if one is.
    pub param: Option<&'static str>,
    /// A stable, machine-readable cause (the audio crate's reason codes for audio).
    pub code: &'static str,
    /// Seconds after which a retry may succeed (429, 503).
    pub retry_after_s: Option<u32>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'static str>,
    code: &'static str,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code,
            retry_after_s: None,
        }
    }

    /// A bad form field: 400 naming the field.
    pub fn invalid(param: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::new(StatusCode::BAD_REQUEST, code, message)
        }
    }

    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// OpenAI's error `type` for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// Audio the decoder refused: 413 for size, 415 for a format or codec it does not know,
    /// 400 for the rest (corrupt, truncated, too short or long, too many channels, ...).
    pub fn audio(reason: &'static str, message: String) -> Self {
        let status = match reason {
            "too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            "unsupported_format" | "unsupported_codec" => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "io" | "internal" | "decoder_panic" | "decoder_crashed" => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            _ => StatusCode::BAD_REQUEST,
        };
        Self {
            param: Some("file"),
            ..Self::new(status, reason, message)
        }
    }
}

impl From<DispatchError> for ApiError {
    fn from(e: DispatchError) -> Self {
        match e {
            DispatchError::Audio { reason, message } => Self::audio(reason, message),
            other => {
                tracing::error!(error = %other, "transcription request failed");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    other.reason_code(),
                    other.to_string(),
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: Detail {
                message: &self.message,
                kind: self.kind(),
                param: self.param,
                code: self.code,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

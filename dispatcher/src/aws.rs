//! AWS clients from the standard configuration chain (environment, profile, web identity,
//! container and instance credentials; `AWS_REGION`; `AWS_ENDPOINT_URL` and the per-service
//! `AWS_ENDPOINT_URL_<SERVICE>` variants are read by the SDK itself).

use aws_config::{BehaviorVersion, SdkConfig};

/// Loads the shared SDK configuration. `endpoint_url` overrides the environment (tests).
pub async fn load(endpoint_url: Option<&str>) -> SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if let Some(url) = endpoint_url {
        loader = loader.endpoint_url(url);
    }
    loader.load().await
}

pub fn s3(config: &SdkConfig, force_path_style: bool) -> aws_sdk_s3::Client {
    let s3_config = aws_sdk_s3::config::Builder::from(config)
        .force_path_style(force_path_style)
        .build();
    aws_sdk_s3::Client::from_conf(s3_config)
}

pub fn sqs(config: &SdkConfig) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(config)
}

pub fn cloudwatch(config: &SdkConfig) -> aws_sdk_cloudwatch::Client {
    aws_sdk_cloudwatch::Client::new(config)
}

/// An SDK error with its causes: the SDK's Display shows only the outermost layer ("dispatch
/// failure").
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

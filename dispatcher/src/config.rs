//! Settings: built-in defaults, overridden by the `--config` TOML file, by `PARAKEET_`
//! variables and by flags (the `cli` crate layers them; every field is all three under one
//! name, and carries its unit in its name).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{DispatchError, Result};

/// Declares each setting once; generates the all-optional flag struct and the resolved one.
macro_rules! settings {
    (
        defaults { $( $(#[doc = $ddoc:expr])* $dfield:ident : $dty:ty = $default:expr ; )* }
        flags { $( $(#[doc = $fdoc:expr])* $ffield:ident ; )* }
        optional { $( $(#[doc = $odoc:expr])* $ofield:ident : $oty:ty ; )* }
    ) => {
        /// Every setting as a flag (an unset one falls through to its default: see
        /// [`SettingsArgs::defaults`] for what `--help` shows).
        #[derive(Debug, Clone, Default, clap::Args)]
        pub struct SettingsArgs {
            $( $(#[doc = $ddoc])* #[arg(long)] pub $dfield: Option<$dty>, )*
            $( $(#[doc = $fdoc])* #[arg(long)] pub $ffield: bool, )*
            $( $(#[doc = $odoc])* #[arg(long)] pub $ofield: Option<$oty>, )*
        }

        /// Resolved settings.
        #[derive(Debug, Clone)]
        pub struct Settings {
            $( $(#[doc = $ddoc])* pub $dfield: $dty, )*
            $( $(#[doc = $fdoc])* pub $ffield: bool, )*
            $( $(#[doc = $odoc])* pub $ofield: Option<$oty>, )*
        }

        impl SettingsArgs {
            /// The built-in defaults by setting id, for the command line to show and apply
            /// (a config file's key replaces one).
            pub fn defaults() -> Vec<(&'static str, String)> {
                vec![ $( (stringify!($dfield), { let value: $dty = $default; value.to_string() }), )* ]
            }

            fn fill_defaults(self) -> Settings {
                Settings {
                    $( $dfield: self.$dfield.unwrap_or_else(|| $default), )*
                    $( $ffield: self.$ffield, )*
                    $( $ofield: self.$ofield, )*
                }
            }
        }
    };
}

settings! {
    defaults {
        /// Messages per receive, 1..=10 (SQS's limit).
        max_messages_per_receive: usize = 10;
        /// Long-poll wait per receive in seconds, 0..=20 (SQS's limit); 20 by default, 1 for
        /// `run --exit-when-idle`, `local` and `serve` (nothing to wait out at the end).
        wait_time_s: u64 = 20;
        /// Visibility timeout asked for on receive, in seconds; heartbeats extend it every
        /// third. Short values notice dead nodes sooner at the cost of more heartbeat calls.
        visibility_timeout_s: u64 = 300;
        /// After SIGTERM, seconds in-flight jobs may take before their messages are released
        /// (keep below the platform's kill timeout; a spot notice gives 120 s).
        drain_grace_s: u64 = 90;
        /// Inputs above this size are refused before download (bytes).
        max_input_bytes: u64 = 2 << 30;
        /// Recordings longer than this are refused (seconds). A recording takes about 230 MB
        /// of memory per hour of audio while it is transcribed.
        max_audio_duration_s: u64 = 12 * 3600;
        /// Longest piece of audio given to the model at once (seconds); longer recordings are
        /// cut at quiet points into pieces no longer than this. The default, full attention's 24
        /// minutes, runs every recording up to that length in one pass, as NeMo's transcribe() does;
        /// raise it to run longer ones in one pass too (local attention beyond
        /// `full_attention_max_s`), or lower it to 30 for the short pieces that batch best.
        max_segment_s: f64 = model_core::long_audio::DEFAULT_FULL_ATTENTION_MAX_S;
        /// Recordings longer than this many seconds are transcribed in checkpoints of about
        /// this much audio each (whole segments), saved in the result location as they
        /// finish: a job stopped by a crash, a drain or SQS's 12 h lease resumes after the last.
        checkpoint_every_s: f64 = 3600.0;
        /// Retries of a transient store error inside one job.
        retry_max: usize = 4;
        /// Longest delay before a transiently failed message is retried (seconds).
        max_retry_delay_s: u64 = 300;
        /// Local spool only: receives after which a message goes to the dead-letter folder.
        max_receives: u32 = 5;
        /// Seconds between metric flushes to CloudWatch.
        metrics_flush_s: u64 = 10;
        /// Seconds between polls of `instance_metadata_url` (AWS asks for every 5 s).
        instance_metadata_poll_s: u64 = 5;
    }
    flags {
        /// Use path-style S3 URLs (for S3-compatible stores such as MinIO or moto).
        s3_force_path_style;
    }
    optional {
        /// Concurrent long-polling receivers (default: one per 32 messages in flight, 2 to 8).
        receivers: usize;
        /// Messages held at once, being fetched, decoded, transcribed or written (default:
        /// the inference slots plus two per decode thread, at most three times the slots, and
        /// no more than fit the open-file limit at two files per job beside 256).
        max_in_flight: usize;
        /// Jobs running inference at once (default: what the engine takes at once: 1 for the
        /// in-process engine, every fleet worker's outstanding requests for a fleet).
        inference_slots: usize;
        /// Segments per model call (default: 8 in process, one worker's outstanding requests
        /// for a fleet); bounds the engine's working memory.
        segments_per_call: usize;
        /// Recordings decoded at once, one OS thread each (default: the host's cores).
        decode_threads: usize;
        /// Default result prefix, `s3://bucket/prefix/` (jobs may name their own).
        output_uri: String;
        /// The model: a `.nemo` checkpoint.
        model: PathBuf;
        /// Model id used in result keys (default: file name plus a hash of the file).
        model_id: String;
        /// The diarization model (a Sortformer `.nemo`); jobs asking for diarization fail
        /// with `diarization_unavailable` without one.
        diar_model: PathBuf;
        /// Diarization model id used in result keys (default: file name plus a hash).
        diar_model_id: String;
        /// SQS queue URL (`run`, `enqueue`, `backfill`).
        queue_url: String;
        /// Serve Prometheus `/metrics` and `/health` here, e.g. 127.0.0.1:9100.
        metrics_listen: std::net::SocketAddr;
        /// Publish metrics to CloudWatch under this namespace.
        cloudwatch_namespace: String;
        /// Encrypt every result with SSE-KMS under this key id or ARN.
        sse_kms_key_id: String;
        /// A TOML file of tenants and the buckets/prefixes each owns (`[tenants.NAME] inputs
        /// = ["s3://..."], outputs = ["s3://..."]`): every job is checked against it before
        /// anything is read or written (dispatcher/src/tenants.rs). Unset: no tenant checks.
        tenants_file: PathBuf;
        /// EC2 instance metadata (IMDSv2) base URL, `http://169.254.169.254` on EC2: `run`
        /// watches it for a Spot interruption notice and for the Auto Scaling group
        /// terminating the instance, and drains on either (stop receiving, finish what fits
        /// before the notice's time, release the rest). Unset: not watched.
        instance_metadata_url: String;
    }
}

impl SettingsArgs {
    /// Unset settings take their defaults; then the whole is checked.
    pub fn resolve(self) -> Result<Settings> {
        let settings = self.fill_defaults();
        settings.validate()?;
        Ok(settings)
    }
}

/// Segments shorter than a second would cut words apart (and a NaN or zero would cut a clip
/// into thousands of pieces): `max_segment_s` must be a number of at least 1.
pub fn check_max_segment_s(value: f64) -> Result<()> {
    if value.is_finite() && value >= 1.0 {
        return Ok(());
    }
    Err(DispatchError::Config(format!(
        "max_segment_s must be a number of seconds of at least 1 (30 is NeMo-like), got {value}"
    )))
}

impl Settings {
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(DispatchError::Config(msg));
        if !(1..=10).contains(&self.max_messages_per_receive) {
            return bad(format!(
                "max_messages_per_receive must be 1..=10, got {}",
                self.max_messages_per_receive
            ));
        }
        if self.wait_time_s > 20 {
            return bad(format!(
                "wait_time_s must be 0..=20, got {}",
                self.wait_time_s
            ));
        }
        if self.visibility_timeout_s == 0 || self.visibility_timeout_s > 43_200 {
            return bad(format!(
                "visibility_timeout_s must be 1..=43200, got {}",
                self.visibility_timeout_s
            ));
        }
        let limits = [
            ("receivers", self.receivers),
            ("max_in_flight", self.max_in_flight),
            ("inference_slots", self.inference_slots),
            ("segments_per_call", self.segments_per_call),
            ("decode_threads", self.decode_threads),
        ];
        if let Some((name, _)) = limits.iter().find(|(_, v)| *v == Some(0)) {
            return bad(format!("{name} must be at least 1 (leave it unset to size it from the engine and the host)"));
        }
        check_max_segment_s(self.max_segment_s)?;
        if !(self.checkpoint_every_s.is_finite() && self.checkpoint_every_s >= 1.0) {
            return bad(format!(
                "checkpoint_every_s must be a number of seconds of at least 1, got {}",
                self.checkpoint_every_s
            ));
        }
        if self.instance_metadata_url.is_some() && self.instance_metadata_poll_s == 0 {
            return bad("instance_metadata_poll_s must be at least 1".into());
        }
        if let Some(uri) = &self.output_uri {
            crate::job::Prefix::parse_uri(uri)?;
        }
        if let Some(path) = &self.tenants_file {
            crate::tenants::Tenants::load(path)?;
        }
        Ok(())
    }

    pub fn visibility(&self) -> Duration {
        Duration::from_secs(self.visibility_timeout_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_rejected() {
        let flags = SettingsArgs {
            max_messages_per_receive: Some(11),
            ..Default::default()
        };
        assert!(flags.resolve().is_err());
        let zero = SettingsArgs {
            decode_threads: Some(0),
            ..Default::default()
        };
        let error = zero.resolve().expect_err("0 decode threads").to_string();
        assert!(error.contains("decode_threads"), "{error}");
    }

    #[test]
    fn defaults_are_listed_for_the_command_line() {
        let defaults = SettingsArgs::defaults();
        let get = |id| {
            defaults
                .iter()
                .find(|(k, _)| *k == id)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("visibility_timeout_s"), Some("300"));
        assert_eq!(get("max_segment_s"), Some("1440"));
        assert_eq!(
            get("max_input_bytes"),
            Some("2147483648"),
            "typed as u64, not i32"
        );
        assert_eq!(get("s3_force_path_style"), None, "a flag, off unless given");
    }
}

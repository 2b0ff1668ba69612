//! What a queue message asks for: our own versioned job message, or an S3 event notification
//! (direct, or wrapped by SNS or EventBridge).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{DispatchError, Result};

/// The job-message schema this build reads and writes.
pub const JOB_SCHEMA_VERSION: u64 = 1;

/// Output formats a job can ask for: the renderers' own enum, so names cannot drift.
pub use model_core::render::OutputFormat;

/// Object name of `format` inside a result prefix.
pub fn result_file_name(format: OutputFormat) -> &'static str {
    match format {
        OutputFormat::Json => "transcript.json",
        OutputFormat::VerboseJson => "transcript.verbose.json",
        OutputFormat::Text => "transcript.txt",
        OutputFormat::Srt => "transcript.srt",
        OutputFormat::Vtt => "transcript.vtt",
        OutputFormat::Rttm => "transcript.rttm",
    }
}

fn default_formats() -> Vec<OutputFormat> {
    // `rttm` only exists for diarized jobs, which get it added (see `Job::output_formats`).
    OutputFormat::TRANSCRIPT.to_vec()
}

/// Our own job message (schema version 1). `input` is `s3://bucket/key` with the key written
/// raw, as the AWS CLI does (no percent-decoding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobMessage {
    pub schema_version: u64,
    pub job_id: String,
    pub input: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_version_id: Option<String>,
    /// `s3://bucket/prefix/`; the dispatcher's configured output prefix when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_prefix: Option<String>,
    #[serde(default = "default_formats")]
    pub formats: Vec<OutputFormat>,
    #[serde(default)]
    pub diarize: bool,
    /// Larger runs first where the queue supports it (informational on SQS standard queues).
    #[serde(default)]
    pub priority: i32,
    /// The tenant the job runs as, checked against the tenants file (when one is configured);
    /// absent: the tenant whose inputs hold the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl JobMessage {
    pub fn new(job_id: impl Into<String>, input: &ObjectRef) -> Self {
        Self {
            schema_version: JOB_SCHEMA_VERSION,
            job_id: job_id.into(),
            input: input.uri(),
            input_version_id: input.version_id.clone(),
            output_prefix: None,
            formats: default_formats(),
            diarize: false,
            priority: 0,
            tenant: None,
        }
    }
}

/// One object, optionally at one version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ObjectRef {
    pub bucket: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
}

impl ObjectRef {
    pub fn new(bucket: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            key: key.into(),
            version_id: None,
        }
    }

    /// `s3://bucket/key` (key raw).
    pub fn uri(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.key)
    }

    /// Parses `s3://bucket/key`; the key must not be empty.
    pub fn parse_uri(uri: &str) -> Result<Self> {
        let (bucket, key) = split_s3_uri(uri)?;
        if key.is_empty() {
            return Err(DispatchError::BadUri {
                uri: uri.to_owned(),
                why: "no object key",
            });
        }
        Ok(Self::new(bucket, key))
    }
}

/// A bucket and a key prefix (possibly empty), e.g. `s3://results/transcripts/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prefix {
    pub bucket: String,
    pub prefix: String,
}

impl Prefix {
    pub fn parse_uri(uri: &str) -> Result<Self> {
        let (bucket, prefix) = split_s3_uri(uri)?;
        Ok(Self {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        })
    }

    /// The prefix followed by `rest`, with exactly one `/` between non-empty parts.
    pub fn join(&self, rest: &str) -> String {
        if self.prefix.is_empty() || self.prefix.ends_with('/') {
            format!("{}{rest}", self.prefix)
        } else {
            format!("{}/{rest}", self.prefix)
        }
    }

    pub fn uri(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}

fn split_s3_uri(uri: &str) -> Result<(&str, &str)> {
    let bad = |why| DispatchError::BadUri {
        uri: uri.to_owned(),
        why,
    };
    let rest = uri.strip_prefix("s3://").ok_or_else(|| bad("not s3://"))?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket"));
    }
    Ok((bucket, key))
}

/// Where a job came from (kept in the manifest for tracing duplicates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobSource {
    JobMessage,
    S3Event,
    EventBridge,
}

/// A job, whatever message shape it arrived in.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub job_id: String,
    pub input: ObjectRef,
    pub output_prefix: Option<Prefix>,
    pub formats: Vec<OutputFormat>,
    pub diarize: bool,
    pub priority: i32,
    /// As named in the job message (S3 events name none).
    pub tenant: Option<String>,
    pub source: JobSource,
}

impl Job {
    /// The documents this job writes: the formats it asked for, plus `rttm` when it asked
    /// for diarization.
    pub fn output_formats(&self) -> Vec<OutputFormat> {
        let mut formats = self.formats.clone();
        if self.diarize && !formats.contains(&OutputFormat::Rttm) {
            formats.push(OutputFormat::Rttm);
        }
        formats
    }
}

/// What a message body turned out to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// Work to do (an S3 event may carry several records).
    Jobs(Vec<Job>),
    /// Nothing to do (`s3:TestEvent`, a non-create event); delete the message.
    Ignore(&'static str),
}

/// Reads a message body. Errors are permanent (bad JSON, unknown schema, invalid fields).
pub fn parse_message(body: &str) -> Result<Parsed> {
    let value: Value =
        serde_json::from_str(body).map_err(|e| DispatchError::BadJson(e.to_string()))?;
    parse_value(value, 0)
}

fn parse_value(value: Value, depth: u8) -> Result<Parsed> {
    let Value::Object(map) = &value else {
        return Err(DispatchError::BadMessage("not a JSON object".into()));
    };
    if let Some(version) = map.get("schema_version") {
        return parse_job_message(version, value.clone());
    }
    if map.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
        return Ok(Parsed::Ignore("s3:TestEvent"));
    }
    if let Some(records) = map.get("Records") {
        return parse_s3_records(records);
    }
    // SNS (raw delivery off): the original notification is a JSON string in `Message`.
    if map.get("Type").and_then(Value::as_str) == Some("Notification") {
        let inner = map
            .get("Message")
            .and_then(Value::as_str)
            .ok_or_else(|| DispatchError::BadMessage("SNS notification without Message".into()))?;
        if depth > 2 {
            return Err(DispatchError::BadMessage(
                "SNS wrapping nested too deep".into(),
            ));
        }
        let inner: Value =
            serde_json::from_str(inner).map_err(|e| DispatchError::BadJson(e.to_string()))?;
        return parse_value(inner, depth + 1);
    }
    if map.get("source").and_then(Value::as_str) == Some("aws.s3") {
        return parse_eventbridge(map);
    }
    Err(DispatchError::BadMessage(
        "neither a job message nor an S3 event notification".into(),
    ))
}

fn parse_job_message(version: &Value, value: Value) -> Result<Parsed> {
    let found = version
        .as_u64()
        .ok_or_else(|| DispatchError::BadMessage("schema_version is not an integer".into()))?;
    if found != JOB_SCHEMA_VERSION {
        return Err(DispatchError::UnknownSchema {
            found,
            expected: JOB_SCHEMA_VERSION,
        });
    }
    let msg: JobMessage =
        serde_json::from_value(value).map_err(|e| DispatchError::BadMessage(e.to_string()))?;
    if msg.job_id.is_empty() {
        return Err(DispatchError::BadMessage("empty job_id".into()));
    }
    if msg.formats.is_empty() {
        return Err(DispatchError::BadMessage("no output formats".into()));
    }
    if !msg.diarize {
        if let Some(f) = msg.formats.iter().find(|f| f.needs_diarization()) {
            return Err(DispatchError::BadMessage(format!(
                "format `{f}` needs `\"diarize\": true`"
            )));
        }
    }
    let mut input = ObjectRef::parse_uri(&msg.input)?;
    input.version_id = msg.input_version_id.filter(|v| !v.is_empty());
    let output_prefix = msg
        .output_prefix
        .as_deref()
        .map(Prefix::parse_uri)
        .transpose()?;
    Ok(Parsed::Jobs(vec![Job {
        job_id: msg.job_id,
        input,
        output_prefix,
        formats: msg.formats,
        diarize: msg.diarize,
        priority: msg.priority,
        tenant: msg.tenant.filter(|t| !t.is_empty()),
        source: JobSource::JobMessage,
    }]))
}

#[derive(Deserialize)]
struct S3Record {
    #[serde(rename = "eventName")]
    event_name: String,
    s3: S3Entity,
}

#[derive(Deserialize)]
struct S3Entity {
    bucket: S3Bucket,
    object: S3Object,
}

#[derive(Deserialize)]
struct S3Bucket {
    name: String,
}

#[derive(Deserialize)]
struct S3Object {
    key: String,
    #[serde(rename = "versionId", default)]
    version_id: Option<String>,
}

fn parse_s3_records(records: &Value) -> Result<Parsed> {
    let records: Vec<S3Record> = serde_json::from_value(records.clone())
        .map_err(|e| DispatchError::BadMessage(format!("S3 event records: {e}")))?;
    let mut jobs = Vec::new();
    for record in records {
        // eventName is "ObjectCreated:Put" (older docs show it with an "s3:" prefix).
        let name = record.event_name.trim_start_matches("s3:");
        if !name.starts_with("ObjectCreated:") {
            continue;
        }
        let key = decode_event_key(&record.s3.object.key)?;
        let mut input = ObjectRef::new(record.s3.bucket.name, key);
        input.version_id = record.s3.object.version_id.filter(|v| !v.is_empty());
        jobs.push(event_job(input, JobSource::S3Event));
    }
    if jobs.is_empty() {
        return Ok(Parsed::Ignore("no ObjectCreated records"));
    }
    Ok(Parsed::Jobs(jobs))
}

fn parse_eventbridge(map: &serde_json::Map<String, Value>) -> Result<Parsed> {
    if map.get("detail-type").and_then(Value::as_str) != Some("Object Created") {
        return Ok(Parsed::Ignore(
            "EventBridge event other than Object Created",
        ));
    }
    let detail = map
        .get("detail")
        .ok_or_else(|| DispatchError::BadMessage("EventBridge event without detail".into()))?;
    let text = |path: &[&str]| {
        let mut v = detail;
        for p in path {
            v = v.get(p)?;
        }
        v.as_str().map(str::to_owned)
    };
    let bucket = text(&["bucket", "name"])
        .ok_or_else(|| DispatchError::BadMessage("EventBridge event without bucket".into()))?;
    // EventBridge's documented examples show the key as-is (not form-encoded), unlike the
    // direct notification; we take it verbatim.
    let key = text(&["object", "key"])
        .ok_or_else(|| DispatchError::BadMessage("EventBridge event without key".into()))?;
    let mut input = ObjectRef::new(bucket, key);
    input.version_id = text(&["object", "version-id"]).filter(|v| !v.is_empty());
    Ok(Parsed::Jobs(vec![event_job(input, JobSource::EventBridge)]))
}

fn event_job(input: ObjectRef, source: JobSource) -> Job {
    Job {
        job_id: format!(
            "s3event:{}@{}",
            input.uri(),
            input.version_id.as_deref().unwrap_or("-")
        ),
        input,
        output_prefix: None,
        formats: default_formats(),
        diarize: false,
        priority: 0,
        tenant: None,
        source,
    }
}

/// S3 notifications form-encode keys ("red flower.jpg" → "red+flower.jpg", "+" → "%2B").
pub fn decode_event_key(raw: &str) -> Result<String> {
    let spaced = raw.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .map(|k| k.into_owned())
        .map_err(|_| DispatchError::BadMessage(format!("event key `{raw}` is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_job(body: &str) -> Job {
        match parse_message(body) {
            Ok(Parsed::Jobs(mut jobs)) if jobs.len() == 1 => jobs.remove(0),
            other => panic!("expected one job, got {other:?}"),
        }
    }

    #[test]
    fn job_message_round_trips() {
        let mut msg = JobMessage::new("j1", &ObjectRef::new("in", "a b/c+d%.wav"));
        msg.output_prefix = Some("s3://out/res/".into());
        msg.formats = vec![OutputFormat::Text, OutputFormat::Srt];
        let job = one_job(&serde_json::to_string(&msg).expect("serialize"));
        assert_eq!(job.input.key, "a b/c+d%.wav");
        assert_eq!(job.output_prefix.expect("prefix").bucket, "out");
        assert_eq!(job.formats, vec![OutputFormat::Text, OutputFormat::Srt]);
    }

    #[test]
    fn rttm_needs_diarization_and_diarized_jobs_get_it() {
        let mut msg = JobMessage::new("j1", &ObjectRef::new("in", "a.wav"));
        msg.formats = vec![OutputFormat::Srt, OutputFormat::Rttm];
        let e = parse_message(&serde_json::to_string(&msg).expect("json")).expect_err("rttm");
        assert_eq!(e.reason_code(), "bad_message");
        msg.diarize = true;
        let job = one_job(&serde_json::to_string(&msg).expect("json"));
        assert_eq!(job.output_formats(), msg.formats);
        msg.formats = JobMessage::new("j2", &ObjectRef::new("in", "a.wav")).formats;
        let job = one_job(&serde_json::to_string(&msg).expect("json"));
        assert_eq!(job.output_formats().last(), Some(&OutputFormat::Rttm));
        assert_eq!(job.output_formats().len(), OutputFormat::ALL.len());
        assert!(job.diarize);
    }

    #[test]
    fn unknown_schema_and_bad_json_are_typed() {
        let e = parse_message(r#"{"schema_version": 99, "job_id": "x", "input": "s3://a/b"}"#)
            .expect_err("v99");
        assert_eq!(e.reason_code(), "unknown_schema_version");
        assert_eq!(
            parse_message("{nope").expect_err("bad").reason_code(),
            "bad_json"
        );
        let e =
            parse_message(r#"{"schema_version": 1, "job_id": "x", "input": "s3://a/b", "x": 1}"#)
                .expect_err("unknown field");
        assert_eq!(e.reason_code(), "bad_message");
    }

    #[test]
    fn s3_event_keys_are_form_decoded() {
        let body = r#"{"Records":[{"eventSource":"aws:s3","eventName":"ObjectCreated:Put",
            "s3":{"bucket":{"name":"b"},"object":{"key":"calls/red+flower%2B1%25+%C3%A9t%C3%A9.wav","versionId":"v1"}}}]}"#;
        let job = one_job(body);
        assert_eq!(job.input.key, "calls/red flower+1% été.wav");
        assert_eq!(job.input.version_id.as_deref(), Some("v1"));
        assert_eq!(job.source, JobSource::S3Event);
    }

    #[test]
    fn test_event_and_removals_are_ignored() {
        let test_event = r#"{"Service":"Amazon S3","Event":"s3:TestEvent","Bucket":"b"}"#;
        assert!(matches!(parse_message(test_event), Ok(Parsed::Ignore(_))));
        let removed = r#"{"Records":[{"eventName":"ObjectRemoved:Delete",
            "s3":{"bucket":{"name":"b"},"object":{"key":"k"}}}]}"#;
        assert!(matches!(parse_message(removed), Ok(Parsed::Ignore(_))));
    }

    #[test]
    fn sns_and_eventbridge_wrappings() {
        let inner = r#"{"Records":[{"eventName":"ObjectCreated:Put","s3":{"bucket":{"name":"b"},"object":{"key":"x+y.wav"}}}]}"#;
        let sns = serde_json::json!({"Type": "Notification", "Message": inner}).to_string();
        assert_eq!(one_job(&sns).input.key, "x y.wav");
        let sns_test = serde_json::json!({"Type": "Notification",
            "Message": r#"{"Event":"s3:TestEvent"}"#})
        .to_string();
        assert!(matches!(parse_message(&sns_test), Ok(Parsed::Ignore(_))));
        let eb = r#"{"source":"aws.s3","detail-type":"Object Created","detail":{
            "bucket":{"name":"b"},"object":{"key":"raw key.wav","version-id":"v9"}}}"#;
        let job = one_job(eb);
        assert_eq!(
            (job.input.key.as_str(), job.source),
            ("raw key.wav", JobSource::EventBridge)
        );
        assert_eq!(job.input.version_id.as_deref(), Some("v9"));
    }
}

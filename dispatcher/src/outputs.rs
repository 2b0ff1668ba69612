//! Where results go and how they are written so that duplicates end in one result.
//!
//! Result keys are deterministic: `<output prefix><input bucket>/<input key>/<model id>/<content
//! tag>/<file>`, where the content tag is the input's ETag (the same bytes give the same tag
//! whichever message named them: job, S3 event with or without versionId, backfill). Every file
//! is written create-only (`If-None-Match: *`); the manifest is written last, so its presence
//! means "done". A 412 on the manifest means another delivery finished first: we read that
//! manifest back and check it is for the same input and model.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{DispatchError, Result};
use crate::job::{result_file_name, Job, ObjectRef, OutputFormat, Prefix};
use crate::lifecycle::retry::{retry_transient, RetrySettings};
use crate::queue::now_ms;
use crate::store::keys::MAX_KEY_BYTES;
use crate::store::{ObjectMeta, ObjectStore, PutOutcome};

pub const MANIFEST_NAME: &str = "manifest.json";
pub const FAILURE_NAME: &str = "failure.json";
pub const RECORD_SCHEMA_VERSION: u32 = 1;
/// Content tag used when the input could not be read at all (missing object).
pub const MISSING_TAG: &str = "missing";
/// Longest output file name we append to a result directory (checkpoints' included).
const LONGEST_NAME: usize = 24;
/// Largest manifest or failure record read back.
const MAX_RECORD_BYTES: u64 = 16 << 20;

/// The directory (key prefix) holding one input's results for one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultLocation {
    pub bucket: String,
    /// Ends with `/`.
    pub dir: String,
}

impl ResultLocation {
    pub fn new(output: &Prefix, input: &ObjectRef, content_tag: &str, model_id: &str) -> Self {
        let tail = format!("{}/{}/", safe_segment(model_id), safe_segment(content_tag));
        let mut dir = output.join(&format!("{}/{}/{tail}", input.bucket, input.key));
        if dir.len() + LONGEST_NAME > MAX_KEY_BYTES {
            // Keys near S3's 1024-byte limit: name the input by its hash instead.
            let hash = format!("{:x}", Sha256::digest(input.key.as_bytes()));
            dir = output.join(&format!("{}/_long-keys/{hash}/{tail}", input.bucket));
        }
        Self {
            bucket: output.bucket.clone(),
            dir,
        }
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.dir)
    }

    pub fn manifest_key(&self) -> String {
        self.key(MANIFEST_NAME)
    }

    pub fn failure_key(&self) -> String {
        self.key(FAILURE_NAME)
    }
}

/// Keeps ids usable as one key segment (and one file name in the local store).
pub fn safe_segment(raw: &str) -> String {
    let s: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '.') {
        "_".into()
    } else {
        s
    }
}

/// The input as the result records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputInfo {
    pub bucket: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
}

impl InputInfo {
    pub fn new(input: &ObjectRef, meta: Option<&ObjectMeta>) -> Self {
        Self {
            bucket: input.bucket.clone(),
            key: input.key.clone(),
            version_id: meta
                .and_then(|m| m.version_id.clone())
                .or_else(|| input.version_id.clone()),
            etag: meta.map(|m| m.etag.clone()),
            size_bytes: meta.map(|m| m.size_bytes),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputEntry {
    pub format: OutputFormat,
    pub key: String,
    pub bytes: u64,
    pub sha256: String,
}

/// Written last; its presence means the job is done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    pub job_id: String,
    pub input: InputInfo,
    pub model_id: String,
    /// The diarization model's id when the job was diarized (its id is also part of
    /// `model_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diarization_model_id: Option<String>,
    pub audio_duration_s: f64,
    pub segments: usize,
    pub outputs: Vec<OutputEntry>,
    pub created_at_ms: u64,
    pub dispatcher_version: String,
}

/// A permanent failure, written instead of a manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRecord {
    pub schema_version: u32,
    pub job_id: String,
    pub input: InputInfo,
    pub model_id: String,
    pub reason_code: String,
    pub message: String,
    pub created_at_ms: u64,
    pub dispatcher_version: String,
}

impl FailureRecord {
    pub fn new(job: &Job, input: InputInfo, model_id: &str, error: &DispatchError) -> Self {
        Self {
            schema_version: RECORD_SCHEMA_VERSION,
            job_id: job.job_id.clone(),
            input,
            model_id: model_id.to_owned(),
            reason_code: error.reason_code().to_owned(),
            message: error.to_string(),
            created_at_ms: now_ms(),
            dispatcher_version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

/// What already exists for a result location.
#[derive(Debug, Clone, PartialEq)]
pub enum Existing {
    Manifest(Manifest),
    Failure(FailureRecord),
}

/// How a write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Written,
    /// Another delivery got there first with a matching record.
    AlreadyDone,
}

pub struct Writer<'a> {
    pub store: &'a dyn ObjectStore,
    pub retry: RetrySettings,
}

impl Writer<'_> {
    /// The manifest or failure record already at `loc`, if any (checked before doing work).
    /// Both are read at once (one round trip to the store, not two); the manifest wins.
    pub async fn existing(&self, loc: &ResultLocation) -> Result<Option<Existing>> {
        let (manifest, failure) = futures_util::future::join(
            self.read_if_present(&loc.bucket, &loc.manifest_key(), MAX_RECORD_BYTES),
            self.read_if_present(&loc.bucket, &loc.failure_key(), MAX_RECORD_BYTES),
        )
        .await;
        if let Some(bytes) = manifest? {
            return Ok(Some(Existing::Manifest(parse_record(
                loc,
                MANIFEST_NAME,
                &bytes,
            )?)));
        }
        match failure? {
            Some(bytes) => Ok(Some(Existing::Failure(parse_record(
                loc,
                FAILURE_NAME,
                &bytes,
            )?))),
            None => Ok(None),
        }
    }

    /// The object's bytes (at most `max_bytes`), `None` when it does not exist.
    pub(crate) async fn read_if_present(
        &self,
        bucket: &str,
        key: &str,
        max_bytes: u64,
    ) -> Result<Option<Bytes>> {
        let object = ObjectRef::new(bucket, key);
        let got = retry_transient(self.retry, "read record", || {
            self.store.get(&object, max_bytes, None)
        })
        .await;
        match got {
            Ok(bytes) => Ok(Some(bytes)),
            Err(DispatchError::ObjectMissing { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes create-only, retrying what is transient.
    pub(crate) async fn put(
        &self,
        bucket: &str,
        key: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<PutOutcome> {
        retry_transient(self.retry, "write result", || {
            self.store
                .put_if_absent(bucket, key, body.clone(), content_type)
        })
        .await
    }

    /// Writes every rendered format, then the manifest (which lists their checksums).
    pub async fn write_result(
        &self,
        loc: &ResultLocation,
        rendered: Vec<(OutputFormat, String)>,
        mut manifest: Manifest,
    ) -> Result<WriteOutcome> {
        manifest.outputs.clear();
        let mut puts = Vec::with_capacity(rendered.len());
        for (format, text) in rendered {
            let key = loc.key(result_file_name(format));
            let body = Bytes::from(text.into_bytes());
            manifest.outputs.push(OutputEntry {
                format,
                key: key.clone(),
                bytes: body.len() as u64,
                sha256: format!("{:x}", Sha256::digest(&body)),
            });
            // An existing file is an earlier delivery's (deterministic) output of the same
            // input and model; the manifest below decides which delivery "won".
            puts.push(async move {
                self.put(&loc.bucket, &key, body, format.content_type())
                    .await
            });
        }
        // The files go up together (one round trip to the store, not one per format); the
        // manifest only once all of them are there.
        futures_util::future::try_join_all(puts).await?;
        let body = serde_json::to_vec_pretty(&manifest).expect("manifest serializes (bug)");
        match self
            .put(
                &loc.bucket,
                &loc.manifest_key(),
                Bytes::from(body),
                "application/json",
            )
            .await?
        {
            PutOutcome::Created => Ok(WriteOutcome::Written),
            PutOutcome::AlreadyExists => {
                self.verify_same(loc, &manifest.input, &manifest.model_id)
                    .await?;
                Ok(WriteOutcome::AlreadyDone)
            }
        }
    }

    pub async fn write_failure(
        &self,
        loc: &ResultLocation,
        record: &FailureRecord,
    ) -> Result<WriteOutcome> {
        let body = serde_json::to_vec_pretty(record).expect("failure record serializes (bug)");
        match self
            .put(
                &loc.bucket,
                &loc.failure_key(),
                Bytes::from(body),
                "application/json",
            )
            .await?
        {
            PutOutcome::Created => Ok(WriteOutcome::Written),
            PutOutcome::AlreadyExists => Ok(WriteOutcome::AlreadyDone),
        }
    }

    /// After a 412: the record that won must describe the same input content and model.
    async fn verify_same(
        &self,
        loc: &ResultLocation,
        input: &InputInfo,
        model_id: &str,
    ) -> Result<()> {
        let mismatch = |why: String| DispatchError::ResultMismatch {
            bucket: loc.bucket.clone(),
            key: loc.manifest_key(),
            why,
        };
        match self.existing(loc).await? {
            Some(Existing::Manifest(m)) => {
                if m.model_id != model_id {
                    return Err(mismatch(format!("model {} vs {model_id}", m.model_id)));
                }
                if m.input.etag != input.etag || m.input.key != input.key {
                    return Err(mismatch(format!(
                        "input {:?} vs {:?}",
                        m.input.etag, input.etag
                    )));
                }
                Ok(())
            }
            _ => Err(mismatch(
                "manifest write returned 412 but none can be read".into(),
            )),
        }
    }
}

fn parse_record<T: serde::de::DeserializeOwned>(
    loc: &ResultLocation,
    name: &str,
    bytes: &[u8],
) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| DispatchError::ResultMismatch {
        bucket: loc.bucket.clone(),
        key: loc.key(name),
        why: format!("unreadable record: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::error::ErrorClass;
    use crate::store::local::LocalStore;
    use crate::store::ListPage;

    /// A local store whose writes take a while, as a remote store's do, and record when each
    /// began and ended; a write whose key ends with `fails` fails for good.
    struct SlowWrites {
        inner: LocalStore,
        fails: Option<&'static str>,
        /// (began, key) in the order they happened.
        events: Mutex<Vec<(bool, String)>>,
    }

    #[async_trait]
    impl ObjectStore for SlowWrites {
        async fn head(&self, object: &ObjectRef) -> Result<Option<ObjectMeta>> {
            self.inner.head(object).await
        }
        async fn get(&self, object: &ObjectRef, max: u64, etag: Option<&str>) -> Result<Bytes> {
            self.inner.get(object, max, etag).await
        }
        async fn put_if_absent(
            &self,
            bucket: &str,
            key: &str,
            body: Bytes,
            content_type: &str,
        ) -> Result<PutOutcome> {
            self.events
                .lock()
                .expect("events lock")
                .push((true, key.to_owned()));
            tokio::time::sleep(Duration::from_millis(30)).await;
            let put = match self.fails {
                Some(name) if key.ends_with(name) => Err(DispatchError::Store {
                    bucket: bucket.to_owned(),
                    key: key.to_owned(),
                    class: ErrorClass::Permanent,
                    message: "refused by the test".into(),
                }),
                _ => {
                    self.inner
                        .put_if_absent(bucket, key, body, content_type)
                        .await
                }
            };
            self.events
                .lock()
                .expect("events lock")
                .push((false, key.to_owned()));
            put
        }
        async fn list_page(
            &self,
            bucket: &str,
            prefix: &str,
            continuation: Option<String>,
        ) -> Result<ListPage> {
            self.inner.list_page(bucket, prefix, continuation).await
        }
    }

    impl SlowWrites {
        /// A store in a new folder, and where one result goes in it.
        fn open(fails: Option<&'static str>) -> (tempfile::TempDir, Self, ResultLocation) {
            let dir = tempfile::tempdir().expect("temp dir");
            std::fs::create_dir_all(dir.path().join("out")).expect("bucket folder");
            let store = Self {
                inner: LocalStore::open(dir.path()).expect("store"),
                fails,
                events: Mutex::new(Vec::new()),
            };
            let out = Prefix::parse_uri("s3://out/t").expect("prefix");
            let loc = ResultLocation::new(&out, &ObjectRef::new("in", "a.wav"), "tag", "m");
            (dir, store, loc)
        }

        fn writer(&self) -> Writer<'_> {
            Writer {
                store: self,
                retry: RetrySettings::default(),
            }
        }

        fn events(&self) -> Vec<(bool, String)> {
            self.events.lock().expect("events lock").clone()
        }

        /// Writes a transcript's files and manifest; the count of files with the outcome.
        async fn write_result(&self, loc: &ResultLocation) -> (usize, Result<WriteOutcome>) {
            let rendered: Vec<_> = OutputFormat::TRANSCRIPT
                .iter()
                .map(|&f| (f, format!("{f} of the test")))
                .collect();
            let manifest = Manifest {
                schema_version: RECORD_SCHEMA_VERSION,
                job_id: "job-1".into(),
                input: InputInfo::new(&ObjectRef::new("in", "a.wav"), None),
                model_id: "m".into(),
                diarization_model_id: None,
                audio_duration_s: 1.0,
                segments: 1,
                outputs: Vec::new(),
                created_at_ms: 0,
                dispatcher_version: "test".into(),
            };
            let files = rendered.len();
            let written = self.writer().write_result(loc, rendered, manifest).await;
            (files, written)
        }
    }

    /// The files are written at once (one round trip to a remote store, not one each) and
    /// the manifest, whose presence means done, only after every one of them has ended.
    #[tokio::test]
    async fn result_files_go_up_together_and_the_manifest_after_them() {
        let (_dir, store, loc) = SlowWrites::open(None);
        let (files, written) = store.write_result(&loc).await;
        assert_eq!(written.expect("result written"), WriteOutcome::Written);

        let events = store.events();
        let manifest_began = events
            .iter()
            .position(|(began, key)| *began && *key == loc.manifest_key())
            .expect("the manifest was written");
        let (before, after) = events.split_at(manifest_began);
        assert_eq!(
            before.len(),
            2 * files,
            "every file began and ended first: {events:?}"
        );
        assert!(
            before[..files].iter().all(|(began, _)| *began),
            "all files began before any ended: {events:?}"
        );
        assert_eq!(after.len(), 2);
        match store.writer().existing(&loc).await.expect("records read") {
            Some(Existing::Manifest(m)) => assert_eq!(m.outputs.len(), files),
            other => panic!("expected the manifest, got {other:?}"),
        }
    }

    /// A file that cannot be written fails the whole result: no manifest claims it is done.
    #[tokio::test]
    async fn a_file_that_fails_leaves_no_manifest() {
        let (_dir, store, loc) = SlowWrites::open(Some("transcript.srt"));
        let (_, written) = store.write_result(&loc).await;
        let error = written.expect_err("the srt write fails");
        assert!(error.to_string().contains("refused by the test"), "{error}");
        assert!(
            !store
                .events()
                .iter()
                .any(|(_, key)| *key == loc.manifest_key()),
            "no manifest write was attempted"
        );
        let existing = store.writer().existing(&loc).await.expect("records read");
        assert_eq!(existing, None);
    }

    #[test]
    fn locations_are_deterministic_and_contained() {
        let out = Prefix::parse_uri("s3://results/transcripts").expect("prefix");
        let input = ObjectRef::new("calls", "2026/a b+c%.wav");
        let a = ResultLocation::new(&out, &input, "\"abc\"", "parakeet tdt/v2");
        let b = ResultLocation::new(&out, &input, "\"abc\"", "parakeet tdt/v2");
        assert_eq!(a, b);
        assert_eq!(
            a.dir,
            "transcripts/calls/2026/a b+c%.wav/parakeet_tdt_v2/_abc_/"
        );
        assert_eq!(a.manifest_key(), format!("{}manifest.json", a.dir));
        let other_model = ResultLocation::new(&out, &input, "\"abc\"", "v3");
        assert_ne!(a, other_model);
    }

    #[test]
    fn very_long_keys_are_hashed() {
        let out = Prefix::parse_uri("s3://results/").expect("prefix");
        let input = ObjectRef::new("calls", "k/".repeat(500) + "x.wav");
        let loc = ResultLocation::new(&out, &input, "tag", "m");
        assert!(loc.key(MANIFEST_NAME).len() <= MAX_KEY_BYTES);
        assert!(loc.dir.contains("_long-keys/"));
    }
}

//! After an incident or a backfill: does every input under a prefix have exactly one
//! complete result for the model (a manifest whose outputs are all there, for the input's
//! current content), a failure record, or nothing? Missing inputs can be enqueued again.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::backfill::JobSender;
use crate::error::Result;
use crate::job::{ObjectRef, Prefix};
use crate::lifecycle::retry::RetrySettings;
use crate::outputs::{Existing, ResultLocation, Writer};
use crate::queue::Queue;
use crate::store::{inspect_at_once, ObjectStore, Pages};

#[derive(Debug, Clone)]
pub struct ReconcileSettings {
    pub source: Prefix,
    pub output: Prefix,
    /// The id in the result keys: the model's, or the model's joined with the diarizer's.
    pub result_model_id: String,
    /// Enqueue missing inputs as diarization jobs.
    pub diarize: bool,
}

/// One input's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum InputState {
    /// A manifest for the input's current content, with every output it lists.
    Complete,
    /// A failure record (the job ended permanently; its reason code).
    Failed { reason: String },
    /// Neither: the job never finished (or the input changed since).
    Missing,
    /// A manifest that does not hold up: an output it lists is gone, or it names other
    /// content. Enqueuing again does not help (the manifest marks the job done): look at it.
    Incomplete { why: String },
}

/// What a prefix holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    pub inputs: u64,
    pub complete: u64,
    pub failed: u64,
    pub failed_by_reason: BTreeMap<String, u64>,
    /// Input keys with no result: the ones to re-enqueue.
    pub missing: Vec<String>,
    /// Input key and what is wrong with its result.
    pub incomplete: Vec<(String, String)>,
    /// Missing inputs sent to the queue (with `--enqueue-missing`).
    pub enqueued: u64,
    pub send_failures: u64,
}

impl ReconcileReport {
    /// Every input has a complete result or a failure record.
    pub fn accounted_for(&self) -> bool {
        self.missing.is_empty() && self.incomplete.is_empty()
    }
}

/// The state of `input` (whose content tag is `etag`) under `output`.
pub async fn inspect(
    store: &dyn ObjectStore,
    output: &Prefix,
    input: &ObjectRef,
    etag: &str,
    result_model_id: &str,
) -> Result<InputState> {
    let loc = ResultLocation::new(output, input, etag, result_model_id);
    let writer = Writer {
        store,
        retry: RetrySettings::default(),
    };
    let manifest = match writer.existing(&loc).await? {
        None => return Ok(InputState::Missing),
        Some(Existing::Failure(record)) => {
            return Ok(InputState::Failed {
                reason: record.reason_code,
            })
        }
        Some(Existing::Manifest(manifest)) => manifest,
    };
    if manifest.input.etag.as_deref() != Some(etag) {
        return Ok(InputState::Incomplete {
            why: format!(
                "{} names content {:?}, the input is {etag}",
                loc.manifest_key(),
                manifest.input.etag
            ),
        });
    }
    for entry in &manifest.outputs {
        let object = ObjectRef::new(&loc.bucket, &entry.key);
        match store.head(&object).await? {
            Some(meta) if meta.size_bytes == entry.bytes => {}
            Some(meta) => {
                return Ok(InputState::Incomplete {
                    why: format!(
                        "{} is {} bytes, the manifest says {}",
                        object.uri(),
                        meta.size_bytes,
                        entry.bytes
                    ),
                })
            }
            None => {
                return Ok(InputState::Incomplete {
                    why: format!("{} is listed in the manifest but missing", object.uri()),
                })
            }
        }
    }
    Ok(InputState::Complete)
}

/// Lists `settings.source` (pages of the store's listing; results under the source prefix
/// are not inputs) and inspects every input; with `enqueue`, sends a job for each missing
/// one. `progress` is called after each page.
pub async fn reconcile(
    store: &dyn ObjectStore,
    mut enqueue: Option<(&dyn Queue, &mut JobSender)>,
    settings: &ReconcileSettings,
    mut progress: impl FnMut(&ReconcileReport),
) -> Result<ReconcileReport> {
    let mut report = ReconcileReport::default();
    let mut pages = Pages::new(store, &settings.source);
    while let Some(objects) = pages.next().await? {
        // Results under the source prefix are not inputs.
        let inputs = objects.iter().filter(|object| {
            settings.source.bucket != settings.output.bucket
                || !object.key.starts_with(&settings.output.prefix)
        });
        let states = inspect_at_once(inputs, |object| async {
            let input = ObjectRef::new(&settings.source.bucket, &object.key);
            let state = inspect(
                store,
                &settings.output,
                &input,
                &object.etag,
                &settings.result_model_id,
            )
            .await?;
            Ok((input, state))
        })
        .await?;
        let mut missing = Vec::new();
        for (input, state) in states {
            report.inputs += 1;
            match state {
                InputState::Complete => report.complete += 1,
                InputState::Failed { reason } => {
                    report.failed += 1;
                    *report.failed_by_reason.entry(reason).or_default() += 1;
                }
                InputState::Missing => {
                    report.missing.push(input.key.clone());
                    missing.push(input);
                }
                InputState::Incomplete { why } => report.incomplete.push((input.key.clone(), why)),
            }
        }
        if let Some((queue, sender)) = enqueue.as_mut() {
            let sent = sender
                .send(*queue, &missing, &settings.output, settings.diarize)
                .await?;
            report.enqueued += sent.enqueued;
            report.send_failures += sent.send_failures;
        }
        progress(&report);
    }
    Ok(report)
}

//! Diarization end to end, on the local spool/store and on SQS/S3 (moto), with the real
//! fixture models (Parakeet `tdt-real-options`, Sortformer `sortformer-tiny`): a job with
//! `"diarize": true` writes RTTM and speaker-labelled verbose_json/srt/vtt that agree with each
//! other, next to (never instead of) the plain result of the same input.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::{engine, records, settings, Backend};
use dispatcher::app::{self, MetricsRuntime};
use dispatcher::config::Settings;
use dispatcher::diarizer::Diarizer;
use dispatcher::job::{JobMessage, OutputFormat};
use dispatcher::lifecycle::RunSummary;
use dispatcher::model_id::diarized_model_id;
use dispatcher::outputs::{FailureRecord, Manifest};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

/// The attribution rule's gap (model_core::speakers::AttributionOptions::default()).
const MAX_GAP_S: f64 = 0.5;
/// Documents round times (and RTTM durations) to the millisecond; overlaps recomputed from
/// them may be a few milliseconds off.
const MS: f64 = 0.005;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures")
        .join(rel)
}

fn diarizer() -> Arc<dyn Diarizer> {
    static DIARIZER: OnceLock<Arc<dyn Diarizer>> = OnceLock::new();
    DIARIZER
        .get_or_init(|| {
            dispatcher::in_process::load_diarizer(
                engine::EngineKind::Cpu,
                &fixture("sortformer-tiny/model.nemo"),
                &engine::EngineSettings::cpu(),
                None,
            )
            .expect("load the sortformer fixture")
        })
        .clone()
}

fn three_speakers() -> Vec<u8> {
    let path = fixture("sortformer-tiny/three_speakers.wav");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn job_body(backend: &Backend, key: &str, diarize: bool) -> String {
    let mut msg = JobMessage::new(uuid::Uuid::new_v4().to_string(), &backend.input(key));
    msg.diarize = diarize;
    serde_json::to_string(&msg).expect("json")
}

async fn run_until_idle(
    backend: &Backend,
    diarizer: Option<Arc<dyn Diarizer>>,
    settings: &Settings,
) -> RunSummary {
    let metrics = MetricsRuntime::start(settings, None)
        .await
        .expect("metrics");
    let parts = app::ConsumerParts {
        queue: backend.queue.clone(),
        store: backend.store.clone(),
        transcriber: engine(),
        diarizer,
    };
    let consumer = app::consumer(settings, parts, &metrics, true).expect("consumer");
    let summary = tokio::time::timeout(
        Duration::from_secs(240),
        consumer.run(CancellationToken::new()),
    )
    .await
    .expect("consumer finished within 240 s");
    metrics.shutdown().await;
    summary
}

async fn text_of(backend: &Backend, key: &str) -> String {
    String::from_utf8(backend.read(key).await.to_vec()).expect("utf-8")
}

/// The manifest's outputs by format, checked against their checksums.
async fn outputs(backend: &Backend, m: &Manifest) -> Vec<(OutputFormat, String)> {
    let mut docs = Vec::new();
    for out in &m.outputs {
        let body = backend.read(&out.key).await;
        assert_eq!(
            format!("{:x}", Sha256::digest(&body)),
            out.sha256,
            "{}",
            out.key
        );
        assert_eq!(body.len() as u64, out.bytes, "{}", out.key);
        docs.push((out.format, String::from_utf8(body.to_vec()).expect("utf-8")));
    }
    docs
}

fn doc(docs: &[(OutputFormat, String)], format: OutputFormat) -> &str {
    docs.iter()
        .find(|(f, _)| *f == format)
        .map(|(_, d)| d.as_str())
        .unwrap_or_else(|| panic!("no {format} output"))
}

struct Turn {
    speaker: String,
    start: f64,
    end: f64,
}

fn parse_rttm(doc: &str, file_id: &str) -> Vec<Turn> {
    doc.lines()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.len(), 10, "{line}");
            assert_eq!((f[0], f[1], f[2]), ("SPEAKER", file_id, "1"), "{line}");
            assert_eq!((f[5], f[6], f[8], f[9]), ("<NA>", "<NA>", "<NA>", "<NA>"));
            let start: f64 = f[3].parse().expect("start");
            let dur: f64 = f[4].parse().expect("duration");
            assert!(dur > 0.0, "{line}");
            Turn {
                speaker: f[7].to_owned(),
                start,
                end: start + dur,
            }
        })
        .collect()
}

/// `(start, end, speaker, text)` of each cue, times as `HH:MM:SS.mmm`, the text's lines
/// joined by spaces.
type Cue = (String, String, Option<String>, String);

fn parse_srt(doc: &str) -> Vec<Cue> {
    doc.split("\n\n")
        .filter(|b| !b.is_empty())
        .enumerate()
        .map(|(k, block)| {
            let lines: Vec<&str> = block.lines().collect();
            assert!((3..=4).contains(&lines.len()), "{block}");
            assert_eq!(lines[0], (k + 1).to_string());
            let (start, end) = lines[1].split_once(" --> ").expect("timing");
            let text = lines[2..].join(" ");
            let (speaker, text) = match text.strip_prefix('[') {
                Some(rest) => {
                    let (s, t) = rest.split_once("] ").expect("speaker prefix");
                    (Some(s.to_owned()), t.to_owned())
                }
                None => (None, text),
            };
            (
                start.replace(',', "."),
                end.replace(',', "."),
                speaker,
                text,
            )
        })
        .collect()
}

fn parse_vtt(doc: &str) -> Vec<Cue> {
    let body = doc.strip_prefix("WEBVTT\n").expect("vtt header");
    body.split("\n\n")
        .map(|b| b.trim_matches('\n'))
        .filter(|b| !b.is_empty())
        .map(|block| {
            let lines: Vec<&str> = block.lines().collect();
            assert!((2..=3).contains(&lines.len()), "{block}");
            let (start, end) = lines[0].split_once(" --> ").expect("timing");
            let text = lines[1..].join(" ");
            let (speaker, text) = match text.strip_prefix("<v ") {
                Some(rest) => {
                    let (s, t) = rest.split_once('>').expect("voice tag");
                    (Some(s.to_owned()), t.to_owned())
                }
                None => (None, text),
            };
            let text = text
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&");
            (start.to_owned(), end.to_owned(), speaker, text)
        })
        .collect()
}

fn seconds(clock: &str) -> f64 {
    let (hms, ms) = clock.split_once('.').expect("clock");
    let parts: Vec<f64> = hms.split(':').map(|p| p.parse().expect("num")).collect();
    parts[0] * 3600.0 + parts[1] * 60.0 + parts[2] + ms.parse::<f64>().expect("ms") / 1000.0
}

fn overlap(turns: &[Turn], speaker: &str, start: f64, end: f64) -> f64 {
    turns
        .iter()
        .filter(|t| t.speaker == speaker)
        .map(|t| (t.end.min(end) - t.start.max(start)).max(0.0))
        .sum()
}

fn distance(turns: &[Turn], speaker: &str, start: f64, end: f64) -> f64 {
    turns
        .iter()
        .filter(|t| t.speaker == speaker)
        .map(|t| (t.start - end).max(start - t.end).max(0.0))
        .fold(f64::INFINITY, f64::min)
}

/// RTTM, verbose_json, srt and vtt of one diarized result tell the same story.
fn check_consistent(docs: &[(OutputFormat, String)], file_id: &str) {
    let turns = parse_rttm(doc(docs, OutputFormat::Rttm), file_id);
    assert!(!turns.is_empty(), "the fixture diarizer finds speech");
    let speakers: BTreeSet<&str> = turns.iter().map(|t| t.speaker.as_str()).collect();

    let verbose: Value =
        serde_json::from_str(doc(docs, OutputFormat::VerboseJson)).expect("verbose_json");
    let words = verbose["words"].as_array().expect("words");
    assert!(!words.is_empty(), "the fixture transcriber finds words");
    let mut labelled = 0;
    for w in words {
        let (start, end) = (
            w["start"].as_f64().expect("start"),
            w["end"].as_f64().expect("end"),
        );
        let best = speakers
            .iter()
            .map(|s| overlap(&turns, s, start, end))
            .fold(0.0, f64::max);
        match w.get("speaker").and_then(Value::as_str) {
            Some(s) => {
                labelled += 1;
                assert!(
                    speakers.contains(s),
                    "word speaker {s} is not in the RTTM: {w}"
                );
                if best > MS {
                    // The largest overlap wins (within the documents' rounding).
                    assert!(overlap(&turns, s, start, end) >= best - MS, "{w}");
                } else {
                    assert!(distance(&turns, s, start, end) <= MAX_GAP_S + MS, "{w}");
                }
            }
            None => {
                let nearest = speakers
                    .iter()
                    .map(|s| distance(&turns, s, start, end))
                    .fold(f64::INFINITY, f64::min);
                assert!(nearest > MAX_GAP_S - MS, "unlabelled word near a turn: {w}");
            }
        }
    }
    assert!(labelled > 0, "some words have speakers");

    let segments = verbose["segments"].as_array().expect("segments");
    for seg in segments {
        let s = seg["speaker"]
            .as_str()
            .expect("every segment has a speaker here");
        let (start, end) = (
            seg["start"].as_f64().expect("s"),
            seg["end"].as_f64().expect("e"),
        );
        let own_words = words.iter().filter(|w| {
            w["start"].as_f64() >= Some(start - MS) && w["end"].as_f64() <= Some(end + MS)
        });
        assert!(
            own_words.clone().any(|w| w["speaker"].as_str() == Some(s)),
            "segment speaker {s} said none of its words: {seg}"
        );
    }

    let srt = parse_srt(doc(docs, OutputFormat::Srt));
    let vtt = parse_vtt(doc(docs, OutputFormat::Vtt));
    assert_eq!(srt, vtt, "srt and vtt cues agree (times, speakers, text)");
    assert!(
        srt.len() >= segments.len(),
        "cues split segments, never merge them"
    );
    // Cues break lines and join words with single spaces.
    let spaced = |texts: &mut dyn Iterator<Item = &str>| {
        texts
            .flat_map(str::split_whitespace)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        spaced(&mut srt.iter().map(|c| c.3.as_str())),
        spaced(&mut segments.iter().filter_map(|s| s["text"].as_str())),
        "cues carry every word once"
    );
    // Cues are consecutive runs of words (zero-length words make times ambiguous at cue
    // edges, so walk the words in order instead of by time).
    let mut next = 0;
    for (start, end, speaker, text) in &srt {
        let speaker = speaker.as_deref().expect("every cue has a speaker here");
        assert!(speakers.contains(speaker), "cue speaker {speaker}");
        assert!(
            seconds(end) - seconds(start) <= 7.0 + MS,
            "{start} --> {end}"
        );
        let mut spelled = String::new();
        let mut count = 0;
        while spelled.len() < text.len() && next + count < words.len() {
            let word = words[next + count]["word"].as_str().expect("word").trim();
            if !spelled.is_empty() && !word.is_empty() {
                spelled.push(' ');
            }
            spelled.push_str(word);
            count += 1;
        }
        assert_eq!(&spelled, text, "a cue is a run of words");
        let run = &words[next..next + count];
        next += count;
        assert!((run[0]["start"].as_f64().expect("start") - seconds(start)).abs() < MS);
        assert!((run[count - 1]["end"].as_f64().expect("end") - seconds(end)).abs() < MS);
        // One speaker per cue: its words are the cue's speaker's, or unlabelled.
        for w in run {
            let ws = w["speaker"].as_str();
            assert!(
                ws.is_none() || ws == Some(speaker),
                "{w} in a {speaker} cue"
            );
        }
    }
    assert_eq!(next, words.len(), "every word is in a cue");
}

/// verbose_json with the speaker fields removed.
fn without_speakers(doc: &str) -> Value {
    let mut v: Value = serde_json::from_str(doc).expect("json");
    for list in ["words", "segments"] {
        for item in v[list].as_array_mut().expect("list") {
            item.as_object_mut().expect("object").remove("speaker");
        }
    }
    v
}

async fn diarized_job_writes_consistent_speaker_outputs(backend: Backend) {
    backend
        .put_input("consult/three speakers.wav", &three_speakers())
        .await;
    backend
        .send(&job_body(&backend, "consult/three speakers.wav", true))
        .await;
    backend
        .send(&job_body(&backend, "consult/three speakers.wav", false))
        .await;
    let s = settings(&backend, |_| {});
    let summary = run_until_idle(&backend, Some(diarizer()), &s).await;
    assert_eq!(
        (summary.done, summary.failed, summary.released),
        (2, 0, 0),
        "{summary:?}"
    );
    assert_eq!(backend.pending().await, 0, "messages deleted");

    let (manifests, failures) = records(&backend).await;
    assert_eq!((manifests.len(), failures.len()), (2, 0), "{manifests:?}");
    let mut diarized = None;
    let mut plain = None;
    for key in &manifests {
        let m: Manifest = serde_json::from_slice(&backend.read(key).await).expect("manifest");
        if m.diarization_model_id.is_some() {
            diarized = Some(m);
        } else {
            plain = Some(m);
        }
    }
    let (diarized, plain) = (
        diarized.expect("diarized result"),
        plain.expect("plain result"),
    );
    assert_eq!(
        diarized.model_id,
        diarized_model_id(engine().model_id(), Some(diarizer().model_id()))
    );
    assert_eq!(plain.model_id, engine().model_id());
    let mut want = OutputFormat::TRANSCRIPT.to_vec();
    want.push(OutputFormat::Rttm);
    let formats: Vec<OutputFormat> = diarized.outputs.iter().map(|o| o.format).collect();
    assert_eq!(formats, want);
    let rttm_key = &diarized.outputs.last().expect("rttm").key;
    assert!(rttm_key.ends_with("/transcript.rttm"), "{rttm_key}");
    assert!(plain.outputs.iter().all(|o| o.format != OutputFormat::Rttm));

    let docs = outputs(&backend, &diarized).await;
    check_consistent(&docs, "three_speakers");

    // Diarization adds speakers and nothing else: the plain result's documents are the
    // diarized ones without labels.
    let plain_docs = outputs(&backend, &plain).await;
    for f in [OutputFormat::Json, OutputFormat::Text] {
        assert_eq!(doc(&docs, f), doc(&plain_docs, f), "{f}");
    }
    assert_eq!(
        without_speakers(doc(&docs, OutputFormat::VerboseJson)),
        serde_json::from_str::<Value>(doc(&plain_docs, OutputFormat::VerboseJson)).expect("json")
    );
    let plain_srt = parse_srt(doc(&plain_docs, OutputFormat::Srt));
    assert!(plain_srt.iter().all(|c| c.2.is_none()));
    assert!(!doc(&plain_docs, OutputFormat::Vtt).contains("<v "));
    // The RTTM names the recording by its key's file stem.
    assert!(text_of(&backend, rttm_key)
        .await
        .starts_with("SPEAKER three_speakers 1 "));
}
both_backends!(diarized_job_writes_consistent_speaker_outputs, 3);

async fn without_a_diarizer_diarized_jobs_fail_and_plain_ones_still_run(backend: Backend) {
    backend
        .put_input("a.wav", &common::clip("espeak_us.wav"))
        .await;
    backend.send(&job_body(&backend, "a.wav", true)).await;
    let s = settings(&backend, |_| {});
    let summary = run_until_idle(&backend, None, &s).await;
    assert_eq!((summary.done, summary.failed), (0, 1), "{summary:?}");
    let (manifests, failures) = records(&backend).await;
    assert_eq!((manifests.len(), failures.len()), (0, 1));
    let record: FailureRecord =
        serde_json::from_slice(&backend.read(&failures[0]).await).expect("failure record");
    assert_eq!(record.reason_code, "diarization_unavailable");
    assert_eq!(
        record.model_id,
        diarized_model_id(engine().model_id(), None)
    );

    // The failure is filed under the diarized id, so it does not block the plain result.
    backend.send(&job_body(&backend, "a.wav", false)).await;
    let summary = run_until_idle(&backend, None, &s).await;
    assert_eq!((summary.done, summary.failed), (1, 0), "{summary:?}");
    // And a diarizer configured later serves the diarized request.
    backend.send(&job_body(&backend, "a.wav", true)).await;
    let summary = run_until_idle(&backend, Some(diarizer()), &s).await;
    assert_eq!((summary.done, summary.failed), (1, 0), "{summary:?}");
    let (manifests, failures) = records(&backend).await;
    assert_eq!((manifests.len(), failures.len()), (2, 1));
}
both_backends!(
    without_a_diarizer_diarized_jobs_fail_and_plain_ones_still_run,
    3
);

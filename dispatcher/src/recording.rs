//! One recording to one transcript, the same for `transcribe`, `local` and `run`: the decoded
//! recording's segments go to the transcriber a few per call, their transcripts are stitched
//! into one (times shifted by each segment's start), and when a diarizer is given it runs over
//! the whole recording at the same time and its speaker turns label the words and segments.
//! A long recording can be transcribed in checkpointed runs of segments ([`Checkpoints`]), so a
//! job that stops part-way resumes where it left off. Synchronous: the pipeline runs it on a
//! blocking thread.

use std::ops::Range;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use model_core::speakers::{attribute_speakers, AttributionOptions, SpeakerSegment};
use model_core::transcript::{Segment, TimedToken, Transcript, Word};

use crate::decode::Decoded;
use crate::diarizer::Diarizer;
use crate::error::{DispatchError, Result};
use crate::transcriber::{Priority, SharedPcm, Transcriber};

/// A recording's transcript (speakers attributed when diarized) and where the time went.
pub struct RecordingResult {
    pub transcript: Transcript,
    /// The diarizer's speaker turns (`None`: not diarized).
    pub speaker_turns: Option<Vec<SpeakerSegment>>,
    /// Seconds in the transcriber (all calls).
    pub inference_s: f64,
    /// Seconds in the diarizer (concurrent with the transcription).
    pub diarization_s: f64,
}

/// Where a long recording's transcription is saved as it goes: consecutive runs of segments,
/// each saved once transcribed and loaded instead of transcribed again when the job resumes.
pub trait Checkpoints: Sync {
    /// Most audio one checkpoint covers, in samples at 16 kHz (at least one segment each).
    fn every_samples(&self) -> usize;
    /// Checkpoint `index`'s saved transcripts of `segments`, if it was saved for exactly these.
    fn load(&self, index: usize, segments: &[Range<usize>]) -> Result<Option<Vec<Piece>>>;
    fn save(&self, index: usize, segments: &[Range<usize>], pieces: &[Piece]) -> Result<()>;
    /// Asked before each checkpoint's work: whether the job must stop here (its lease is
    /// lost, or it is being cancelled); what is saved stays for the next attempt.
    fn stop_requested(&self) -> bool;
}

/// The segments of each checkpoint: consecutive runs of whole segments, each covering at most
/// `every_samples` of audio (a longer segment is a run of its own).
pub fn checkpoint_runs(segments: &[Range<usize>], every_samples: usize) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    for (i, segment) in segments.iter().enumerate() {
        if i > start && segment.end - segments[start].start > every_samples {
            runs.push(start..i);
            start = i;
        }
    }
    if start < segments.len() {
        runs.push(start..segments.len());
    }
    runs
}

/// Transcribes `decoded` with `segments_per_call` segments per transcriber call at `priority`,
/// diarizing the whole recording alongside when `diarizer` is given, and saving (or resuming
/// from) `checkpoints` when given.
pub fn transcribe_recording(
    transcriber: &dyn Transcriber,
    diarizer: Option<&dyn Diarizer>,
    decoded: &Decoded,
    segments_per_call: usize,
    priority: Priority,
    checkpoints: Option<&dyn Checkpoints>,
) -> Result<RecordingResult> {
    let pcm = SharedPcm::from(decoded.pcm.clone());
    let (transcription, diarization) = std::thread::scope(|scope| {
        let diarization = diarizer.map(|d| {
            scope.spawn(move || {
                let t = Instant::now();
                d.diarize(&pcm)
                    .map(|turns| (turns, t.elapsed().as_secs_f64()))
            })
        });
        let t = Instant::now();
        let transcription = match checkpoints {
            Some(checkpoints) => transcribe_checkpointed(
                transcriber,
                decoded,
                segments_per_call,
                priority,
                checkpoints,
            ),
            None => transcribe_segments(
                transcriber,
                decoded,
                &decoded.segments,
                segments_per_call,
                priority,
            ),
        }
        .map(|pieces| (pieces, t.elapsed().as_secs_f64()));
        let diarization = diarization.map(|handle| {
            handle.join().unwrap_or_else(|_| {
                Err(DispatchError::Inference(
                    "diarization thread panicked".into(),
                ))
            })
        });
        (transcription, diarization)
    });
    let (pieces, inference_s) = transcription?;
    let mut transcript = stitch(pieces, decoded.duration_s);
    let (speaker_turns, diarization_s) = match diarization {
        Some(result) => {
            let (turns, seconds) = result?;
            attribute_speakers(&mut transcript, &turns, &AttributionOptions::default());
            (Some(turns), seconds)
        }
        None => (None, 0.0),
    };
    Ok(RecordingResult {
        transcript,
        speaker_turns,
        inference_s,
        diarization_s,
    })
}

/// Checkpoint by checkpoint: a saved one is loaded, the others transcribed and saved.
fn transcribe_checkpointed(
    transcriber: &dyn Transcriber,
    decoded: &Decoded,
    segments_per_call: usize,
    priority: Priority,
    checkpoints: &dyn Checkpoints,
) -> Result<Vec<Piece>> {
    let runs = checkpoint_runs(&decoded.segments, checkpoints.every_samples());
    let mut pieces = Vec::with_capacity(decoded.segments.len());
    for (index, run) in runs.iter().enumerate() {
        let segments = &decoded.segments[run.clone()];
        if let Some(saved) = checkpoints.load(index, segments)? {
            pieces.extend(saved);
            continue;
        }
        if checkpoints.stop_requested() {
            return Err(DispatchError::Stopped {
                saved: index,
                checkpoints: runs.len(),
            });
        }
        let new = transcribe_segments(transcriber, decoded, segments, segments_per_call, priority)?;
        checkpoints.save(index, segments, &new)?;
        // A long job's progress, for whoever reads the log.
        tracing::info!(
            checkpoint = index + 1,
            checkpoints = runs.len(),
            "checkpoint saved"
        );
        pieces.extend(new);
    }
    Ok(pieces)
}

/// Each of `segments`' transcript, in order, with its offset in the recording.
fn transcribe_segments(
    transcriber: &dyn Transcriber,
    decoded: &Decoded,
    segments: &[Range<usize>],
    segments_per_call: usize,
    priority: Priority,
) -> Result<Vec<Piece>> {
    let frame_s = transcriber.frame_duration_s();
    let rate = f64::from(audio::TARGET_SAMPLE_RATE_HZ);
    let mut pieces = Vec::with_capacity(segments.len());
    for batch in segments.chunks(segments_per_call.max(1)) {
        // Parts of the recording's samples, not copies of them.
        let parts = batch
            .iter()
            .map(|r| SharedPcm::part(decoded.pcm.clone(), r.clone()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                DispatchError::Inference("a segment outside its recording (bug)".into())
            })?;
        let transcripts = transcriber.transcribe_at(&parts, priority)?;
        if transcripts.len() != batch.len() {
            return Err(DispatchError::Inference(format!(
                "{} transcripts for {} segments (bug)",
                transcripts.len(),
                batch.len()
            )));
        }
        for (range, transcript) in batch.iter().zip(transcripts) {
            let offset_s = range.start as f64 / rate;
            pieces.push(Piece {
                offset_s,
                offset_frames: (offset_s / frame_s).round() as usize,
                transcript,
            });
        }
    }
    Ok(pieces)
}

/// A segment's transcript and where the segment starts in the recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Piece {
    pub offset_s: f64,
    /// Encoder frames before this segment (for frame-indexed token spans).
    pub offset_frames: usize,
    pub transcript: Transcript,
}

/// Joins per-segment transcripts into one, shifting times (and frames) by each segment's
/// start and renumbering segments. A recording that is one segment from its start keeps the
/// model's transcript exactly as computed (NeMo's, for a clip NeMo would take whole).
pub fn stitch(mut pieces: Vec<Piece>, duration_s: f64) -> Transcript {
    if pieces.len() == 1 && pieces[0].offset_s == 0.0 && pieces[0].offset_frames == 0 {
        if let Some(only) = pieces.pop() {
            return Transcript {
                duration_s,
                ..only.transcript
            };
        }
    }
    let mut out = Transcript {
        text: String::new(),
        duration_s,
        tokens: Vec::new(),
        words: Vec::new(),
        segments: Vec::new(),
    };
    let mut texts = Vec::new();
    for piece in pieces {
        let (dt, df) = (piece.offset_s, piece.offset_frames);
        let t = piece.transcript;
        let text = t.text.trim();
        if !text.is_empty() {
            texts.push(text.to_owned());
        }
        out.tokens
            .extend(t.tokens.into_iter().map(|tok| TimedToken {
                start_frame: tok.start_frame + df,
                end_frame: tok.end_frame + df,
                start_s: tok.start_s + dt,
                end_s: tok.end_s + dt,
                ..tok
            }));
        out.words.extend(t.words.into_iter().map(|w| Word {
            start_s: w.start_s + dt,
            end_s: w.end_s + dt,
            ..w
        }));
        for seg in t.segments {
            let id = out.segments.len();
            out.segments.push(Segment {
                id,
                start_s: seg.start_s + dt,
                end_s: seg.end_s + dt,
                ..seg
            });
        }
    }
    out.text = texts.join(" ");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(offset_s: f64, offset_frames: usize, word: &str) -> Piece {
        Piece {
            offset_s,
            offset_frames,
            transcript: Transcript {
                text: format!(" {word}"),
                duration_s: 2.0,
                tokens: vec![TimedToken {
                    id: 7,
                    piece: word.into(),
                    start_frame: 1,
                    end_frame: 3,
                    start_s: 0.08,
                    end_s: 0.24,
                }],
                words: vec![Word {
                    word: word.into(),
                    start_s: 0.08,
                    end_s: 0.24,
                    speaker: None,
                }],
                segments: vec![Segment {
                    id: 0,
                    start_s: 0.08,
                    end_s: 0.24,
                    text: word.into(),
                    tokens: vec![7],
                    speaker: None,
                    avg_logprob: None,
                    no_speech_prob: None,
                }],
            },
        }
    }

    #[test]
    fn checkpoint_runs_hold_whole_segments_up_to_the_limit() {
        let segments = [0..10, 10..25, 25..30, 30..80, 80..85];
        assert_eq!(checkpoint_runs(&segments, 30), vec![0..3, 3..4, 4..5]);
        assert_eq!(checkpoint_runs(&segments, 1000), vec![0..5]);
        assert_eq!(
            checkpoint_runs(&segments, 1),
            vec![0..1, 1..2, 2..3, 3..4, 4..5]
        );
        assert!(checkpoint_runs(&[], 30).is_empty());
    }

    #[test]
    fn one_segment_from_the_start_is_kept_as_computed() {
        let t = stitch(vec![piece(0.0, 0, "hello")], 3.5);
        assert_eq!(t.text, " hello");
        assert_eq!(t.duration_s, 3.5);
        assert_eq!(t.words[0].start_s, 0.08);
    }

    #[test]
    fn stitch_shifts_times_and_renumbers() {
        let t = stitch(
            vec![piece(0.0, 0, "hello"), piece(10.0, 125, "world")],
            12.0,
        );
        assert_eq!(t.text, "hello world");
        assert_eq!(t.duration_s, 12.0);
        assert_eq!(t.words[1].start_s, 10.08);
        assert_eq!(t.tokens[1].start_frame, 126);
        assert_eq!(
            t.segments.iter().map(|s| s.id).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(t.segments[1].end_s, 10.24);
    }
}

//! Transcript documents in the formats of OpenAI's transcription API: `json`, `verbose_json`,
//! `text`, `srt` and `vtt`; and the diarizer's speaker turns as `rttm`.
//!
//! Times in documents lie within the recording, `[0, duration]`, and are rounded to the
//! millisecond (the transcript keeps NeMo's exact floats, which may end past the audio:
//! [`Transcript::clamp_span`]). Every document ends with a newline, and an empty transcript
//! renders as a valid document of its format.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::speakers::SpeakerSegment;
use crate::transcript::Transcript;

mod cues;
mod rttm;

pub use rttm::rttm;

/// An output format; parses from and prints as its API name (`verbose_json`, ...), in Rust
/// (`FromStr`/`Display`) and in serde documents alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    Json,
    VerboseJson,
    Text,
    Srt,
    Vtt,
    /// The diarizer's speaker turns (needs diarization).
    Rttm,
}

impl OutputFormat {
    pub const ALL: [OutputFormat; 6] = [
        OutputFormat::Json,
        OutputFormat::VerboseJson,
        OutputFormat::Text,
        OutputFormat::Srt,
        OutputFormat::Vtt,
        OutputFormat::Rttm,
    ];

    /// The formats every transcript has (all but `rttm`, which needs diarization).
    pub const TRANSCRIPT: [OutputFormat; 5] = [
        OutputFormat::Json,
        OutputFormat::VerboseJson,
        OutputFormat::Text,
        OutputFormat::Srt,
        OutputFormat::Vtt,
    ];

    /// Whether the document needs speaker turns.
    pub fn needs_diarization(self) -> bool {
        self == OutputFormat::Rttm
    }

    /// The name used by the API and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            OutputFormat::Json => "json",
            OutputFormat::VerboseJson => "verbose_json",
            OutputFormat::Text => "text",
            OutputFormat::Srt => "srt",
            OutputFormat::Vtt => "vtt",
            OutputFormat::Rttm => "rttm",
        }
    }

    /// File extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::Json | OutputFormat::VerboseJson => "json",
            OutputFormat::Text => "txt",
            OutputFormat::Srt => "srt",
            OutputFormat::Vtt => "vtt",
            OutputFormat::Rttm => "rttm",
        }
    }

    /// HTTP `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            OutputFormat::Json | OutputFormat::VerboseJson => "application/json",
            OutputFormat::Text | OutputFormat::Rttm => "text/plain; charset=utf-8",
            OutputFormat::Srt => "application/x-subrip; charset=utf-8",
            OutputFormat::Vtt => "text/vtt; charset=utf-8",
        }
    }
}

impl fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OutputFormat {
    type Err = CoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OutputFormat::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| CoreError::UnknownOutputFormat(s.to_string()))
    }
}

/// [`RenderOptions::max_cue_s`] by default (Netflix's longest subtitle event).
pub const DEFAULT_MAX_CUE_S: f64 = 7.0;
/// [`RenderOptions::max_line_chars`] by default (Netflix's line length for Latin scripts).
pub const DEFAULT_MAX_LINE_CHARS: usize = 42;
/// [`RenderOptions::max_lines`] by default.
pub const DEFAULT_MAX_LINES: usize = 2;

/// The language `verbose_json` names by default: Parakeet TDT 0.6B v2 transcribes English
/// only, and its checkpoint's config names no language.
pub const MODEL_LANGUAGE: &str = "english";

/// What the transcript itself does not know, and how subtitles are laid out.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderOptions {
    /// `language` of `verbose_json` (OpenAI writes the language name, e.g. `english`); the
    /// model's ([`MODEL_LANGUAGE`]) by default, omitted when `None`.
    pub language: Option<String>,
    /// The recording's name in `rttm` lines (whitespace becomes `_`; `audio` when `None`).
    pub file_id: Option<String>,
    /// The diarizer's turns, for `rttm` (empty: no diarization, an empty document).
    pub speaker_turns: Vec<SpeakerSegment>,
    /// Longest subtitle cue (`srt`, `vtt`), in seconds; a cue is cut at a word boundary
    /// before it would last longer (one word lasting longer gets a cue this long).
    pub max_cue_s: f64,
    /// Most characters (Unicode scalar values) on one subtitle line, the `srt` speaker label
    /// included (`vtt` keeps the same lines); a word longer than that gets a line of its own.
    pub max_line_chars: usize,
    /// Most lines in one subtitle cue (lines are broken at word boundaries and balanced).
    pub max_lines: usize,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            language: Some(MODEL_LANGUAGE.to_owned()),
            file_id: None,
            speaker_turns: Vec::new(),
            max_cue_s: DEFAULT_MAX_CUE_S,
            max_line_chars: DEFAULT_MAX_LINE_CHARS,
            max_lines: DEFAULT_MAX_LINES,
        }
    }
}

impl RenderOptions {
    /// The cue layout. srt and vtt have the same cues: the room the `srt` speaker label takes
    /// on a first line is kept in `vtt` too (where the label is a `<v>` tag).
    fn layout(&self) -> cues::Layout {
        let max_ms = (self.max_cue_s * 1000.0).round();
        cues::Layout {
            // `as` saturates: NaN and negatives become 0 (one word a cue).
            max_ms: max_ms as u64,
            max_line_chars: self.max_line_chars,
            max_lines: self.max_lines.max(1),
            label_chars: |speaker| srt_label(speaker).chars().count(),
        }
    }
}

/// `transcript` as a document of `format`.
pub fn render(transcript: &Transcript, format: OutputFormat, options: &RenderOptions) -> String {
    match format {
        OutputFormat::Json => json(transcript),
        OutputFormat::VerboseJson => verbose_json(transcript, options.language.as_deref()),
        OutputFormat::Text => text(transcript),
        OutputFormat::Srt => srt(transcript, options),
        OutputFormat::Vtt => vtt(transcript, options),
        OutputFormat::Rttm => rttm(
            options.file_id.as_deref().unwrap_or_default(),
            &options.speaker_turns,
        ),
    }
}

fn round_ms(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}

fn to_json_line<T: Serialize>(value: &T) -> String {
    let mut out = serde_json::to_string(value)
        .expect("plain structs with string keys always serialize (bug)");
    out.push('\n');
    out
}

/// `{"text": ...}`.
pub fn json(transcript: &Transcript) -> String {
    #[derive(Serialize)]
    struct Doc<'a> {
        text: &'a str,
    }
    to_json_line(&Doc {
        text: &transcript.text,
    })
}

/// Whisper's `compression_ratio` of `text`: its UTF-8 length over its zlib-compressed length
/// at zlib's default level 6 (`len(b) / len(zlib.compress(b))`; 0 for an empty text).
///
/// Compressed with zlib itself (flate2's C backend, the library Python's `zlib` module wraps):
/// the Rust deflaters (miniz_oxide, zlib-rs) compress texts of a few hundred bytes and more to
/// a few bytes more or less, which would change the ratio.
pub fn compression_ratio(text: &str) -> f64 {
    use std::io::Write;
    let bytes = text.as_bytes();
    let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
    let compressed = zlib
        .write_all(bytes)
        .and_then(|()| zlib.finish())
        .expect("compressing into a Vec cannot fail (bug)");
    bytes.len() as f64 / compressed.len() as f64
}

#[derive(Serialize)]
struct VerboseSegment<'a> {
    id: usize,
    /// Whisper's window offset; there are no windows here.
    seek: usize,
    start: f64,
    end: f64,
    text: &'a str,
    tokens: &'a [u32],
    /// Greedy decoding.
    temperature: f64,
    compression_ratio: f64,
    /// Absent only where the engine did not score the utterance.
    #[serde(skip_serializing_if = "Option::is_none")]
    avg_logprob: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    no_speech_prob: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    speaker: Option<&'a str>,
}

#[derive(Serialize)]
struct VerboseWord<'a> {
    word: &'a str,
    start: f64,
    end: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    speaker: Option<&'a str>,
}

#[derive(Serialize)]
struct VerboseDoc<'a> {
    task: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    language: Option<&'a str>,
    duration: f64,
    text: &'a str,
    segments: Vec<VerboseSegment<'a>>,
    words: Vec<VerboseWord<'a>>,
}

/// A span as a document prints it: within the recording, rounded to the millisecond.
fn printed_span(transcript: &Transcript, start_s: f64, end_s: f64) -> (f64, f64) {
    let (start, end) = transcript.clamp_span(start_s, end_s);
    (round_ms(start), round_ms(end))
}

/// OpenAI's `verbose_json` (`TranscriptionVerbose`): task, language, duration, text, segments
/// (id, seek, start, end, text, tokens, temperature, compression_ratio) and words (word, start,
/// end); speaker labels when present.
///
/// A segment's `avg_logprob` and `no_speech_prob` are the decoder's ([`crate::scores`]: the mean
/// log-probability of its tokens, the mean blank probability over its frames), left out only
/// where the engine did not score it rather than made up. `compression_ratio` is the segment's
/// own (Whisper's segments share their 30 s window's; there are no windows here).
pub fn verbose_json(transcript: &Transcript, language: Option<&str>) -> String {
    let segments = transcript
        .segments
        .iter()
        .map(|s| {
            let (start, end) = printed_span(transcript, s.start_s, s.end_s);
            VerboseSegment {
                id: s.id,
                seek: 0,
                start,
                end,
                text: &s.text,
                tokens: &s.tokens,
                temperature: 0.0,
                compression_ratio: compression_ratio(&s.text),
                avg_logprob: s.avg_logprob,
                no_speech_prob: s.no_speech_prob,
                speaker: s.speaker.as_deref(),
            }
        })
        .collect();
    let words = transcript
        .words
        .iter()
        .map(|w| {
            let (start, end) = printed_span(transcript, w.start_s, w.end_s);
            VerboseWord {
                word: &w.word,
                start,
                end,
                speaker: w.speaker.as_deref(),
            }
        })
        .collect();
    to_json_line(&VerboseDoc {
        task: "transcribe",
        language,
        duration: round_ms(transcript.duration_s),
        text: &transcript.text,
        segments,
        words,
    })
}

/// The text and a newline.
pub fn text(transcript: &Transcript) -> String {
    format!("{}\n", transcript.text)
}

/// `HH:MM:SS<sep>mmm`, hours widening past 99.
fn clock(seconds: f64, millis_separator: char) -> String {
    // `as` saturates: NaN and negatives become 0.
    let total_ms = (seconds * 1000.0).round() as u64;
    let (hours, rest) = (total_ms / 3_600_000, total_ms % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let (secs, millis) = (rest / 1000, rest % 1000);
    format!("{hours:02}:{minutes:02}:{secs:02}{millis_separator}{millis:03}")
}

/// SubRip: numbered cues, `HH:MM:SS,mmm`, laid out by `options` (each non-empty segment cut
/// into cues of at most `max_cue_s` and `max_lines` lines of `max_line_chars`); with
/// speakers, a segment is also split where its words change speaker and each cue starts with
/// `[speaker_N] `.
pub fn srt(transcript: &Transcript, options: &RenderOptions) -> String {
    let layout = options.layout();
    let mut out = String::new();
    for (number, cue) in cues::cues(transcript, &layout).into_iter().enumerate() {
        let speaker = cue.speaker.map(srt_label).unwrap_or_default();
        out.push_str(&format!(
            "{}\n{} --> {}\n{speaker}{}\n\n",
            number + 1,
            clock(cue.start_s, ','),
            clock(cue.end_s, ','),
            cue.lines.join("\n"),
        ));
    }
    out
}

/// The speaker's label that starts an `srt` cue.
fn srt_label(speaker: &str) -> String {
    format!("[{speaker}] ")
}

/// WebVTT cue text escapes `&`, `<` and `>` (which also rules out a `-->` in the text).
fn vtt_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// WebVTT: the header, then the cues of [`srt`] (the same times and lines), `HH:MM:SS.mmm`;
/// with speakers, each cue is a `<v speaker_N>` voice span.
pub fn vtt(transcript: &Transcript, options: &RenderOptions) -> String {
    let layout = options.layout();
    let mut out = String::from("WEBVTT\n");
    for cue in cues::cues(transcript, &layout) {
        let voice = cue
            .speaker
            .map(|s| format!("<v {}>", vtt_escape(s)))
            .unwrap_or_default();
        out.push_str(&format!(
            "\n{} --> {}\n{voice}{}\n",
            clock(cue.start_s, '.'),
            clock(cue.end_s, '.'),
            vtt_escape(&cue.lines.join("\n")),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{Segment, Word};

    fn segment(id: usize, start_s: f64, end_s: f64, text: &str) -> Segment {
        Segment {
            id,
            start_s,
            end_s,
            text: text.to_string(),
            tokens: vec![id as u32 + 10, id as u32 + 20],
            speaker: None,
            avg_logprob: None,
            no_speech_prob: None,
        }
    }

    fn word(word: &str, start_s: f64, end_s: f64) -> Word {
        Word {
            word: word.to_string(),
            start_s,
            end_s,
            speaker: None,
        }
    }

    fn sample() -> Transcript {
        Transcript {
            text: "Hi there. <b>A&B</b>?".to_string(),
            duration_s: 3_725.000_4,
            tokens: Vec::new(),
            words: vec![
                word("Hi", 0.0, 0.08),
                word("there.", 0.08, 0.56),
                word("<b>A&B</b>?", 0.7200000000000001, 3_724.999_6),
            ],
            segments: vec![
                segment(0, 0.0, 0.56, "Hi there."),
                segment(1, 0.7200000000000001, 3_724.999_6, "<b>A&B</b>?"),
            ],
        }
    }

    fn empty() -> Transcript {
        Transcript {
            text: String::new(),
            duration_s: 0.5,
            tokens: Vec::new(),
            words: Vec::new(),
            segments: Vec::new(),
        }
    }

    #[test]
    fn json_has_only_text() {
        assert_eq!(json(&sample()), "{\"text\":\"Hi there. <b>A&B</b>?\"}\n");
        assert_eq!(json(&empty()), "{\"text\":\"\"}\n");
    }

    #[test]
    fn verbose_json_golden() {
        let expected = concat!(
            r#"{"task":"transcribe","language":"english","duration":3725.0,"text":"Hi there. <b>A&B</b>?","#,
            r#""segments":[{"id":0,"seek":0,"start":0.0,"end":0.56,"text":"Hi there.","tokens":[10,20],"temperature":0.0,"compression_ratio":0.5294117647058824},"#,
            r#"{"id":1,"seek":0,"start":0.72,"end":3725.0,"text":"<b>A&B</b>?","tokens":[11,21],"temperature":0.0,"compression_ratio":0.5789473684210527}],"#,
            r#""words":[{"word":"Hi","start":0.0,"end":0.08},{"word":"there.","start":0.08,"end":0.56},"#,
            r#"{"word":"<b>A&B</b>?","start":0.72,"end":3725.0}]}"#,
            "\n"
        );
        assert_eq!(verbose_json(&sample(), Some("english")), expected);
        assert_eq!(
            verbose_json(&empty(), None),
            "{\"task\":\"transcribe\",\"duration\":0.5,\"text\":\"\",\"segments\":[],\"words\":[]}\n"
        );
    }

    #[test]
    fn verbose_json_carries_speakers() {
        let mut t = sample();
        t.segments[0].speaker = Some("speaker_0".into());
        t.words[1].speaker = Some("speaker_1".into());
        let doc: serde_json::Value =
            serde_json::from_str(&verbose_json(&t, None)).expect("valid json");
        assert_eq!(doc["segments"][0]["speaker"], "speaker_0");
        assert!(doc["segments"][1].get("speaker").is_none());
        assert_eq!(doc["words"][1]["speaker"], "speaker_1");
        assert!(doc.get("language").is_none());
    }

    #[test]
    fn text_golden() {
        assert_eq!(text(&sample()), "Hi there. <b>A&B</b>?\n");
        assert_eq!(text(&empty()), "\n");
    }

    fn srt(transcript: &Transcript) -> String {
        super::srt(transcript, &RenderOptions::default())
    }

    fn vtt(transcript: &Transcript) -> String {
        super::vtt(transcript, &RenderOptions::default())
    }

    #[test]
    fn srt_golden() {
        // The one-word segment lasting an hour shows for the longest a cue may: 7 s.
        let expected = "1\n00:00:00,000 --> 00:00:00,560\nHi there.\n\n\
                        2\n00:00:00,720 --> 00:00:07,720\n<b>A&B</b>?\n\n";
        assert_eq!(srt(&sample()), expected);
        assert_eq!(srt(&empty()), "");
    }

    #[test]
    fn vtt_golden() {
        let expected = "WEBVTT\n\n00:00:00.000 --> 00:00:00.560\nHi there.\n\n\
                        00:00:00.720 --> 00:00:07.720\n&lt;b&gt;A&amp;B&lt;/b&gt;?\n";
        assert_eq!(vtt(&sample()), expected);
        assert_eq!(vtt(&empty()), "WEBVTT\n");
    }

    #[test]
    fn cues_skip_empty_segments_and_keep_one_line() {
        let mut t = sample();
        t.segments.insert(1, segment(1, 0.56, 0.6, " "));
        t.segments[0].text = "Hi\n\nthere.".into();
        t.segments[0].speaker = Some("A".into());
        let srt = srt(&t);
        assert!(srt.starts_with("1\n00:00:00,000 --> 00:00:00,560\n[A] Hi there.\n\n2\n"));
        assert_eq!(srt.matches(" --> ").count(), 2);
        let vtt = vtt(&t);
        assert!(vtt.contains("\n<v A>Hi there.\n"));
        assert_eq!(vtt.matches(" --> ").count(), 2);
    }

    #[test]
    fn speaker_changes_split_srt_and_vtt_cues() {
        let mut t = sample();
        for (w, s) in t
            .words
            .iter_mut()
            .zip(["speaker_0", "speaker_1", "speaker_1"])
        {
            w.speaker = Some(s.into());
        }
        t.segments[0].speaker = Some("speaker_1".into());
        t.segments[1].speaker = Some("speaker_1".into());
        assert_eq!(
            srt(&t),
            "1\n00:00:00,000 --> 00:00:00,080\n[speaker_0] Hi\n\n\
             2\n00:00:00,080 --> 00:00:00,560\n[speaker_1] there.\n\n\
             3\n00:00:00,720 --> 00:00:07,720\n[speaker_1] <b>A&B</b>?\n\n"
        );
        assert_eq!(
            vtt(&t),
            "WEBVTT\n\n00:00:00.000 --> 00:00:00.080\n<v speaker_0>Hi\n\
             \n00:00:00.080 --> 00:00:00.560\n<v speaker_1>there.\n\
             \n00:00:00.720 --> 00:00:07.720\n<v speaker_1>&lt;b&gt;A&amp;B&lt;/b&gt;?\n"
        );
        // The other documents do not change shape; verbose_json keeps the two segments.
        assert_eq!(text(&t), text(&sample()));
        let doc: serde_json::Value =
            serde_json::from_str(&verbose_json(&t, None)).expect("valid json");
        assert_eq!(doc["segments"].as_array().map(Vec::len), Some(2));
    }

    /// The cues of an srt document: (start, end, lines), times in milliseconds.
    fn srt_cues(doc: &str) -> Vec<(u64, u64, Vec<String>)> {
        let ms = |clock: &str| {
            let (hms, millis) = clock.split_once(',').expect("HH:MM:SS,mmm");
            let secs = hms
                .split(':')
                .map(|p| p.parse::<u64>().expect("number"))
                .fold(0, |acc, p| acc * 60 + p);
            secs * 1000 + millis.parse::<u64>().expect("millis")
        };
        doc.split_terminator("\n\n")
            .enumerate()
            .map(|(k, block)| {
                let mut lines = block.lines();
                assert_eq!(lines.next(), Some((k + 1).to_string().as_str()));
                let times = lines.next().expect("times");
                let (start, end) = times.split_once(" --> ").expect("arrow");
                (ms(start), ms(end), lines.map(String::from).collect())
            })
            .collect()
    }

    /// One 25 s segment of 290 characters in words of 1 to 11 letters, said evenly.
    fn long_segment() -> Transcript {
        let mut words: Vec<String> = Vec::new();
        let mut chars = 0;
        for k in 0.. {
            let len = [3, 7, 2, 9, 5, 4, 11, 6, 1, 8][k % 10];
            let remaining = 290 - chars - usize::from(k > 0);
            if remaining <= 12 {
                words.push("z".repeat(remaining));
                break;
            }
            words.push(
                (0..len)
                    .map(|i| char::from(b'a' + ((k + i) % 26) as u8))
                    .collect(),
            );
            chars += len + usize::from(k > 0);
        }
        let text = words.join(" ");
        assert_eq!(text.len(), 290);
        let n = words.len() as f64;
        let words: Vec<Word> = words
            .iter()
            .enumerate()
            .map(|(i, w)| word(w, 25.0 * i as f64 / n, 25.0 * (i as f64 + 0.8) / n))
            .collect();
        Transcript {
            text: text.clone(),
            duration_s: 25.0,
            tokens: Vec::new(),
            segments: vec![Segment {
                end_s: words[words.len() - 1].end_s,
                ..segment(0, 0.0, 0.0, &text)
            }],
            words,
        }
    }

    /// Every cue within the limits, in order, the words each said once.
    fn check_cues(t: &Transcript, cues: &[(u64, u64, Vec<String>)]) {
        let mut last_end = 0;
        for (start, end, lines) in cues {
            assert!(last_end <= *start && start <= end, "{cues:?}");
            assert!(end - start <= 7_000, "{start}..{end}");
            assert!(*end as f64 <= t.duration_s * 1000.0);
            assert!((1..=2).contains(&lines.len()), "{lines:?}");
            for line in lines {
                assert!(line.chars().count() <= 42, "{line:?}");
            }
            last_end = *end;
        }
        let said: Vec<String> = cues
            .iter()
            .flat_map(|(_, _, lines)| {
                lines
                    .join(" ")
                    .split(' ')
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
            .collect();
        let words: Vec<&str> = t.words.iter().map(|w| w.word.as_str()).collect();
        assert_eq!(said, words);
    }

    #[test]
    fn a_long_segment_becomes_short_cues() {
        let t = long_segment();
        let cues = srt_cues(&srt(&t));
        assert!(cues.len() >= 4, "{cues:?}");
        check_cues(&t, &cues);
        assert_eq!(cues[0].0, 0);
        let last_end = t.words[t.words.len() - 1].end_s;
        assert_eq!(cues[cues.len() - 1].1, (last_end * 1000.0).round() as u64);
        // Lines are balanced: a two-line cue's lines differ by less than its longest word.
        for (_, _, lines) in &cues {
            if let [a, b] = &lines[..] {
                assert!(a.len().abs_diff(b.len()) <= 12, "{lines:?}");
            }
        }
        // vtt has the same cues.
        let vtt_doc = vtt(&t);
        let srt_doc = srt(&t);
        let from_srt: Vec<&str> = srt_doc.lines().filter(|l| l.contains(" --> ")).collect();
        let from_vtt: Vec<String> = vtt_doc
            .lines()
            .filter(|l| l.contains(" --> "))
            .map(|l| l.replace('.', ","))
            .collect();
        assert_eq!(from_srt, from_vtt);

        // With a speaker, the srt label takes room on the first line.
        let mut t = t;
        t.segments[0].speaker = Some("speaker_0".into());
        for w in &mut t.words {
            w.speaker = Some("speaker_0".into());
        }
        let cues = srt_cues(&srt(&t));
        for (_, _, lines) in &cues {
            assert!(lines[0].starts_with("[speaker_0] "), "{lines:?}");
        }
        let unlabelled: Vec<_> = cues
            .into_iter()
            .map(|(a, b, mut lines)| {
                lines[0] = lines[0].replacen("[speaker_0] ", "", 1);
                (a, b, lines)
            })
            .collect();
        check_cues(&t, &unlabelled);
    }

    #[test]
    fn cue_layout_follows_the_options() {
        let t = long_segment();
        let options = RenderOptions {
            max_cue_s: 2.0,
            max_line_chars: 20,
            max_lines: 1,
            ..RenderOptions::default()
        };
        let cues = srt_cues(&super::srt(&t, &options));
        for (start, end, lines) in &cues {
            assert!(end - start <= 2_000 && lines.len() == 1 && lines[0].len() <= 20);
        }
        assert!(cues.len() > srt_cues(&srt(&t)).len());
    }

    #[test]
    fn times_stay_in_the_recording() {
        // NeMo's last word of the 2.0 s silence clip ends at 2.08 s.
        let mut t = sample();
        t.duration_s = 2.0;
        t.words[2].end_s = 2.08;
        t.segments[1].end_s = 2.08;
        let doc: serde_json::Value =
            serde_json::from_str(&verbose_json(&t, None)).expect("valid json");
        assert_eq!(doc["words"][2]["end"], 2.0);
        assert_eq!(doc["segments"][1]["end"], 2.0);
        assert!(srt(&t).contains("00:00:00,720 --> 00:00:02,000\n"));
        assert!(vtt(&t).contains("00:00:00.720 --> 00:00:02.000\n"));
        // A word starting after the end starts and ends at the end.
        t.words[2].start_s = 2.04;
        t.segments[1].start_s = 2.04;
        let doc: serde_json::Value =
            serde_json::from_str(&verbose_json(&t, None)).expect("valid json");
        assert_eq!(
            (&doc["words"][2]["start"], &doc["words"][2]["end"]),
            (&2.0.into(), &2.0.into())
        );
        assert!(srt(&t).contains("00:00:02,000 --> 00:00:02,000\n"));
    }

    #[test]
    fn compression_ratio_is_pythons() {
        // len(b) / len(zlib.compress(b)) by Python 3.11's zlib (1.2.13).
        assert_eq!(compression_ratio(""), 0.0);
        assert_eq!(compression_ratio("Hello world."), 0.6);
        assert_eq!(compression_ratio("Hi there."), 0.5294117647058824);
        assert_eq!(compression_ratio(&["so"; 18].join(" ")), 3.7857142857142856);
        assert_eq!(
            compression_ratio("Grüße aus Köln, naïve café."),
            0.7804878048780488
        );
        // 1543 bytes to 333: miniz_oxide makes 328 of them.
        let long = (0..60)
            .map(|i| {
                format!(
                    "word{} and then {} more",
                    i * 7919 % 1000,
                    i * 104_729 % 977
                )
            })
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(long.len(), 1543);
        assert_eq!(compression_ratio(&long), 1543.0 / 333.0);
        assert_eq!(compression_ratio(&long), 4.633633633633633);
    }

    #[test]
    fn rttm_comes_from_the_options() {
        let turns = vec![
            SpeakerSegment {
                speaker: 1,
                start_s: 0.5,
                end_s: 1.0,
            },
            SpeakerSegment {
                speaker: 0,
                start_s: 0.0,
                end_s: 0.75,
            },
        ];
        let options = RenderOptions {
            file_id: Some("call 7".into()),
            speaker_turns: turns,
            ..RenderOptions::default()
        };
        assert_eq!(
            render(&sample(), OutputFormat::Rttm, &options),
            "SPEAKER call_7 1 0.000 0.750 <NA> <NA> speaker_0 <NA> <NA>\n\
             SPEAKER call_7 1 0.500 0.500 <NA> <NA> speaker_1 <NA> <NA>\n"
        );
        assert_eq!(
            render(&sample(), OutputFormat::Rttm, &RenderOptions::default()),
            ""
        );
        // Speaker turns change no other document.
        for f in OutputFormat::TRANSCRIPT {
            assert_eq!(
                render(&sample(), f, &options),
                render(&sample(), f, &RenderOptions::default()),
                "{f}"
            );
        }
    }

    #[test]
    fn clock_rounds_to_milliseconds_and_widens_hours() {
        assert_eq!(clock(0.0, ','), "00:00:00,000");
        assert_eq!(clock(0.0005, '.'), "00:00:00.001");
        assert_eq!(clock(59.9996, ','), "00:01:00,000");
        assert_eq!(clock(98.96000000000001, '.'), "00:01:38.960");
        assert_eq!(clock(360_000.0, ','), "100:00:00,000");
        assert_eq!(clock(f64::NAN, ','), "00:00:00,000");
    }

    #[test]
    fn formats_parse_and_print_their_names() {
        for f in OutputFormat::ALL {
            assert_eq!(f.to_string().parse::<OutputFormat>().expect("parses"), f);
        }
        assert_eq!(OutputFormat::Text.extension(), "txt");
        assert_eq!(OutputFormat::Rttm.extension(), "rttm");
        assert!(OutputFormat::ALL
            .iter()
            .all(|f| OutputFormat::TRANSCRIPT.contains(f) != f.needs_diarization()));
        assert_eq!(OutputFormat::Vtt.content_type(), "text/vtt; charset=utf-8");
        assert!(matches!(
            "xml".parse::<OutputFormat>(),
            Err(CoreError::UnknownOutputFormat(s)) if s == "xml"
        ));
    }
}

//! Transcript documents in the formats of OpenAI's transcription API: `json`, `verbose_json`,
//! `text`, `srt` and `vtt`; and the diarizer's speaker turns as `rttm`.
//!
//! Times in documents are rounded to the millisecond (the transcript keeps NeMo's exact
//! floats). Every document ends with a newline, and an empty transcript renders as a valid
//! document of its format.

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

/// What the transcript itself does not know.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// `language` of `verbose_json` (OpenAI writes the language name, e.g. `english`); omitted
    /// when `None`.
    pub language: Option<String>,
    /// The recording's name in `rttm` lines (whitespace becomes `_`; `audio` when `None`).
    pub file_id: Option<String>,
    /// The diarizer's turns, for `rttm` (empty: no diarization, an empty document).
    pub speaker_turns: Vec<SpeakerSegment>,
}

/// `transcript` as a document of `format`.
pub fn render(transcript: &Transcript, format: OutputFormat, options: &RenderOptions) -> String {
    match format {
        OutputFormat::Json => json(transcript),
        OutputFormat::VerboseJson => verbose_json(transcript, options.language.as_deref()),
        OutputFormat::Text => text(transcript),
        OutputFormat::Srt => srt(transcript),
        OutputFormat::Vtt => vtt(transcript),
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

/// OpenAI's `verbose_json`: task, language, duration, text, segments (id, seek, start, end,
/// text, tokens, temperature) and words (word, start, end); speaker labels when present.
/// Whisper's per-segment `avg_logprob`, `compression_ratio` and `no_speech_prob` are not
/// computed and therefore left out.
pub fn verbose_json(transcript: &Transcript, language: Option<&str>) -> String {
    let segments = transcript
        .segments
        .iter()
        .map(|s| VerboseSegment {
            id: s.id,
            seek: 0,
            start: round_ms(s.start_s),
            end: round_ms(s.end_s),
            text: &s.text,
            tokens: &s.tokens,
            temperature: 0.0,
            speaker: s.speaker.as_deref(),
        })
        .collect();
    let words = transcript
        .words
        .iter()
        .map(|w| VerboseWord {
            word: &w.word,
            start: round_ms(w.start_s),
            end: round_ms(w.end_s),
            speaker: w.speaker.as_deref(),
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

/// SubRip: one numbered cue per non-empty segment, `HH:MM:SS,mmm`; with speakers, a segment
/// is split where its words change speaker and each cue starts with `[speaker_N] `.
pub fn srt(transcript: &Transcript) -> String {
    let mut out = String::new();
    for (number, cue) in cues::cues(transcript).into_iter().enumerate() {
        let speaker = cue.speaker.map(|s| format!("[{s}] ")).unwrap_or_default();
        out.push_str(&format!(
            "{}\n{} --> {}\n{speaker}{}\n\n",
            number + 1,
            clock(cue.start_s, ','),
            clock(cue.end_s, ','),
            cue.text,
        ));
    }
    out
}

/// WebVTT cue text escapes `&`, `<` and `>` (which also rules out a `-->` in the text).
fn vtt_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// WebVTT: the header, then one cue per non-empty segment, `HH:MM:SS.mmm`; with speakers, a
/// segment is split where its words change speaker and each cue is a `<v speaker_N>` voice span.
pub fn vtt(transcript: &Transcript) -> String {
    let mut out = String::from("WEBVTT\n");
    for cue in cues::cues(transcript) {
        let voice = cue
            .speaker
            .map(|s| format!("<v {}>", vtt_escape(s)))
            .unwrap_or_default();
        out.push_str(&format!(
            "\n{} --> {}\n{voice}{}\n",
            clock(cue.start_s, '.'),
            clock(cue.end_s, '.'),
            vtt_escape(&cue.text),
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
            r#""segments":[{"id":0,"seek":0,"start":0.0,"end":0.56,"text":"Hi there.","tokens":[10,20],"temperature":0.0},"#,
            r#"{"id":1,"seek":0,"start":0.72,"end":3725.0,"text":"<b>A&B</b>?","tokens":[11,21],"temperature":0.0}],"#,
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

    #[test]
    fn srt_golden() {
        let expected = "1\n00:00:00,000 --> 00:00:00,560\nHi there.\n\n\
                        2\n00:00:00,720 --> 01:02:05,000\n<b>A&B</b>?\n\n";
        assert_eq!(srt(&sample()), expected);
        assert_eq!(srt(&empty()), "");
    }

    #[test]
    fn vtt_golden() {
        let expected = "WEBVTT\n\n00:00:00.000 --> 00:00:00.560\nHi there.\n\n\
                        00:00:00.720 --> 01:02:05.000\n&lt;b&gt;A&amp;B&lt;/b&gt;?\n";
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
             3\n00:00:00,720 --> 01:02:05,000\n[speaker_1] <b>A&B</b>?\n\n"
        );
        assert_eq!(
            vtt(&t),
            "WEBVTT\n\n00:00:00.000 --> 00:00:00.080\n<v speaker_0>Hi\n\
             \n00:00:00.080 --> 00:00:00.560\n<v speaker_1>there.\n\
             \n00:00:00.720 --> 01:02:05.000\n<v speaker_1>&lt;b&gt;A&amp;B&lt;/b&gt;?\n"
        );
        // The other documents do not change shape; verbose_json keeps the two segments.
        assert_eq!(text(&t), text(&sample()));
        let doc: serde_json::Value =
            serde_json::from_str(&verbose_json(&t, None)).expect("valid json");
        assert_eq!(doc["segments"].as_array().map(Vec::len), Some(2));
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

//! Subtitle cues (srt, vtt) from a transcript's segments.
//!
//! Without speakers there is one cue per non-empty segment. A segment whose words were said by
//! more than one speaker is split into one cue per run of same-speaker words, each labelled
//! with its own speaker: a subtitle labelled with one speaker must not carry another's words.
//! Words without a speaker stay in the run they are in. The split is only made when the words
//! spell out the segment's text exactly (as the timestamp pass builds it); otherwise the
//! segment stays one cue with its majority speaker.

use crate::speakers::segment_word_ranges;
use crate::transcript::{Segment, Transcript, Word};

/// One subtitle cue.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cue<'a> {
    pub start_s: f64,
    pub end_s: f64,
    /// One line, never empty.
    pub text: String,
    pub speaker: Option<&'a str>,
}

/// `text` on one line (a blank line would end the cue), `None` when empty.
pub(crate) fn one_line(text: &str) -> Option<String> {
    let line = text
        .split(['\r', '\n'])
        .filter(|part| !part.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    (!line.is_empty()).then_some(line)
}

pub(crate) fn cues(transcript: &Transcript) -> Vec<Cue<'_>> {
    let mut out = Vec::with_capacity(transcript.segments.len());
    let has_speakers = transcript.segments.iter().any(|s| s.speaker.is_some());
    let ranges = if has_speakers {
        segment_word_ranges(transcript)
    } else {
        Vec::new()
    };
    for (k, segment) in transcript.segments.iter().enumerate() {
        let Some(text) = one_line(&segment.text) else {
            continue;
        };
        let words = ranges
            .get(k)
            .map_or(&[][..], |r| &transcript.words[r.clone()]);
        match speaker_runs(segment, &text, words) {
            Some(runs) => out.extend(runs),
            None => out.push(Cue {
                start_s: segment.start_s,
                end_s: segment.end_s,
                text,
                speaker: segment.speaker.as_deref(),
            }),
        }
    }
    out
}

/// One cue per same-speaker run of `words`, or `None` when the segment stays whole (one
/// speaker, or words that do not spell out `text`).
fn speaker_runs<'a>(segment: &'a Segment, text: &str, words: &'a [Word]) -> Option<Vec<Cue<'a>>> {
    segment.speaker.as_ref()?;
    let spelled = words
        .iter()
        .map(|w| w.word.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    if one_line(&spelled).as_deref() != Some(text) {
        return None;
    }
    // Runs as word index ranges; a word without a speaker joins the run it is in.
    let mut runs: Vec<(usize, usize, Option<&str>)> = Vec::new();
    for (i, word) in words.iter().enumerate() {
        match (runs.last_mut(), word.speaker.as_deref()) {
            (Some(run), None) => run.1 = i + 1,
            (Some(run), Some(s)) if run.2.is_none() || run.2 == Some(s) => {
                run.1 = i + 1;
                run.2 = Some(s);
            }
            (_, speaker) => runs.push((i, i + 1, speaker)),
        }
    }
    if runs.len() < 2 {
        return None;
    }
    runs.into_iter()
        .map(|(a, b, speaker)| {
            let run = &words[a..b];
            let text = one_line(
                &run.iter()
                    .map(|w| w.word.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
            )?;
            Some(Cue {
                start_s: run[0].start_s,
                end_s: run[run.len() - 1].end_s,
                text,
                speaker,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(text: &str, start_s: f64, end_s: f64, speaker: Option<&str>) -> Word {
        Word {
            word: text.into(),
            start_s,
            end_s,
            speaker: speaker.map(String::from),
        }
    }

    fn transcript(words: Vec<Word>, speaker: Option<&str>) -> Transcript {
        let text = words
            .iter()
            .map(|w| w.word.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        Transcript {
            text: text.clone(),
            duration_s: 10.0,
            tokens: Vec::new(),
            segments: vec![Segment {
                id: 0,
                start_s: words[0].start_s,
                end_s: words[words.len() - 1].end_s,
                text,
                tokens: Vec::new(),
                speaker: speaker.map(String::from),
            }],
            words,
        }
    }

    #[test]
    fn splits_at_speaker_changes() {
        let t = transcript(
            vec![
                word("Hi", 0.0, 0.2, Some("speaker_0")),
                word("um", 0.3, 0.4, None),
                word("yes", 0.5, 0.8, Some("speaker_1")),
                word("sure.", 0.9, 1.2, Some("speaker_1")),
            ],
            Some("speaker_1"),
        );
        let got: Vec<(f64, f64, String, Option<&str>)> = cues(&t)
            .into_iter()
            .map(|c| (c.start_s, c.end_s, c.text, c.speaker))
            .collect();
        assert_eq!(
            got,
            vec![
                (0.0, 0.4, "Hi um".to_owned(), Some("speaker_0")),
                (0.5, 1.2, "yes sure.".to_owned(), Some("speaker_1"))
            ]
        );
    }

    #[test]
    fn one_speaker_or_mismatched_words_keep_the_segment_whole() {
        let mut t = transcript(
            vec![
                word("a", 0.0, 0.2, Some("speaker_0")),
                word("b", 0.3, 0.4, Some("speaker_1")),
            ],
            Some("speaker_0"),
        );
        t.segments[0].text = "a c".into();
        let c = cues(&t);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].text.as_str(), c[0].speaker),
            ("a c", Some("speaker_0"))
        );
        t.segments[0].text = "a b".into();
        t.words[1].speaker = Some("speaker_0".into());
        assert_eq!(cues(&t).len(), 1);
    }

    #[test]
    fn leading_words_without_speaker_join_the_first_run() {
        let t = transcript(
            vec![
                word("so", 0.0, 0.2, None),
                word("a", 0.3, 0.4, Some("speaker_1")),
                word("b", 0.5, 0.6, Some("speaker_0")),
            ],
            Some("speaker_1"),
        );
        let c = cues(&t);
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].text.as_str(), c[0].speaker),
            ("so a", Some("speaker_1"))
        );
        assert_eq!((c[1].start_s, c[1].speaker), (0.5, Some("speaker_0")));
    }
}

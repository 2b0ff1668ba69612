//! Subtitle cues (srt, vtt) from a transcript's segments.
//!
//! A segment becomes one or more cues, cut at word boundaries so that each cue lasts at most
//! [`Layout::max_ms`] and its text fits in [`Layout::max_lines`] lines of at most
//! [`Layout::max_line_chars`] characters (speaker label included). A segment gets as few cues
//! as those limits allow, as even in length as can be; a cue's lines are as few as its words
//! need and then balanced (the longest line as short as possible). A word longer than a line
//! gets a line of its own, and a word lasting longer than a cue gets a cue of its own that ends
//! `max_ms` after it starts. Cue times are the first word's start and the last word's end, with
//! every word's times first clamped to `[0, duration]`.
//!
//! A segment whose words were said by more than one speaker is first split into runs of
//! same-speaker words, each labelled with its own speaker: a subtitle labelled with one speaker
//! must not carry another's words. Words without a speaker stay in the run they are in.
//!
//! Words are used only when they spell out the segment's text exactly (as the timestamp pass
//! builds it). Otherwise (no word timings) the segment's text is cut at spaces and each piece
//! gets the share of the segment's time that its characters have of the text: subtitles of the
//! right size with approximate times, rather than one long cue; the segment's speaker labels
//! every piece.

use crate::speakers::segment_word_ranges;
use crate::transcript::{Segment, Transcript, Word};

/// How cues are cut and laid out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Longest cue, in milliseconds (as the documents print times).
    pub max_ms: u64,
    /// Most characters on one line (Unicode scalar values), the label's included.
    pub max_line_chars: usize,
    /// Most lines in one cue (at least one).
    pub max_lines: usize,
    /// Characters the speaker's label takes at the start of a cue's first line.
    pub label_chars: fn(&str) -> usize,
}

/// One subtitle cue.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cue<'a> {
    pub start_s: f64,
    pub end_s: f64,
    /// The text's lines: at least one, none empty or containing a line break.
    pub lines: Vec<String>,
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

/// A word of a cue: trimmed, never empty, within the recording.
#[derive(Debug, Clone, PartialEq)]
struct Timed<'a> {
    text: &'a str,
    chars: usize,
    start_s: f64,
    end_s: f64,
}

impl<'a> Timed<'a> {
    fn new(transcript: &Transcript, text: &'a str, start_s: f64, end_s: f64) -> Option<Self> {
        let text = text.trim();
        let (start_s, end_s) = transcript.clamp_span(start_s, end_s);
        (!text.is_empty()).then(|| Timed {
            text,
            chars: text.chars().count(),
            start_s,
            end_s,
        })
    }
}

pub(crate) fn cues<'a>(transcript: &'a Transcript, layout: &Layout) -> Vec<Cue<'a>> {
    let mut out = Vec::with_capacity(transcript.segments.len());
    let ranges = segment_word_ranges(transcript);
    for (k, segment) in transcript.segments.iter().enumerate() {
        let Some(text) = one_line(&segment.text) else {
            continue;
        };
        let words = ranges
            .get(k)
            .map_or(&[][..], |r| &transcript.words[r.clone()]);
        if !spell(words, &text) {
            let pieces = interpolated(transcript, segment, &text);
            pack(&pieces, segment.speaker.as_deref(), layout, &mut out);
            continue;
        }
        let runs = speaker_runs(segment, words)
            .unwrap_or_else(|| vec![(words, segment.speaker.as_deref())]);
        for (run, speaker) in runs {
            let timed: Vec<Timed<'_>> = run
                .iter()
                .filter_map(|w| Timed::new(transcript, &w.word, w.start_s, w.end_s))
                .collect();
            pack(&timed, speaker, layout, &mut out);
        }
    }
    out
}

/// Whether `words` spell out a segment's one-line `text`.
fn spell(words: &[Word], text: &str) -> bool {
    let spelled = words
        .iter()
        .map(|w| w.word.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    one_line(&spelled).as_deref() == Some(text)
}

/// `text` cut at spaces, each piece timed by its characters' share of the segment.
fn interpolated<'a>(transcript: &Transcript, segment: &Segment, text: &'a str) -> Vec<Timed<'a>> {
    let total = text.chars().count().max(1) as f64;
    let span = segment.end_s - segment.start_s;
    let at = |chars: usize| segment.start_s + span * chars as f64 / total;
    let mut pieces = Vec::new();
    let mut chars_before = 0;
    for piece in text.split(' ') {
        let chars = piece.chars().count();
        pieces.extend(Timed::new(
            transcript,
            piece,
            at(chars_before),
            at(chars_before + chars),
        ));
        chars_before += chars + 1;
    }
    pieces
}

/// The same-speaker runs of `words` with their speakers, or `None` when the segment stays one
/// run (no speaker, or a single one).
fn speaker_runs<'a>(
    segment: &'a Segment,
    words: &'a [Word],
) -> Option<Vec<(&'a [Word], Option<&'a str>)>> {
    segment.speaker.as_ref()?;
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
    (runs.len() >= 2).then(|| {
        runs.into_iter()
            .map(|(a, b, speaker)| (&words[a..b], speaker))
            .collect()
    })
}

/// Milliseconds as the documents print them (`as` saturates: NaN and negatives become 0).
fn ms(seconds: f64) -> u64 {
    (seconds * 1000.0).round() as u64
}

/// Cues of `words` (one speaker's, in order) appended to `out`: as few cues as the limits
/// allow, as even in length as can be (the least sum of squared characters), so a long
/// sentence does not end in a one-word cue.
fn pack<'a>(
    words: &[Timed<'_>],
    speaker: Option<&'a str>,
    layout: &Layout,
    out: &mut Vec<Cue<'a>>,
) {
    let label = speaker.map_or(0, layout.label_chars);
    let fits_cue = |cue: &[Timed<'_>]| {
        cue.len() == 1
            || (ms(cue[cue.len() - 1].end_s).saturating_sub(ms(cue[0].start_s)) <= layout.max_ms
                && line_count(cue, label, layout.max_line_chars) <= layout.max_lines)
    };
    // best[j]: (cues, sum of squared characters, where the last cue starts) for words[..j].
    let n = words.len();
    let mut best = vec![None::<(usize, usize, usize)>; n + 1];
    best[0] = Some((0, 0, 0));
    for j in 1..=n {
        // A cue that does not fit does not fit with more words before it either.
        for i in (0..j).rev().take_while(|&i| fits_cue(&words[i..j])) {
            let Some((cues, squares, _)) = best[i] else {
                continue;
            };
            let chars = width(&words[i..j], label);
            let candidate = (cues + 1, squares + chars * chars, i);
            if best[j].is_none_or(|(c, s, _)| (candidate.0, candidate.1) < (c, s)) {
                best[j] = Some(candidate);
            }
        }
    }
    let mut starts = vec![n];
    while let Some(&j) = starts.last().filter(|&&j| j > 0) {
        let Some((_, _, i)) = best[j] else {
            unreachable!("a cue of one word always fits");
        };
        starts.push(i);
    }
    starts.reverse();
    for w in starts.windows(2) {
        let cue = &words[w[0]..w[1]];
        let start_s = cue[0].start_s;
        let mut end_s = cue[cue.len() - 1].end_s;
        if ms(end_s).saturating_sub(ms(start_s)) > layout.max_ms {
            // One word lasting longer than a cue may.
            end_s = (ms(start_s) + layout.max_ms) as f64 / 1000.0;
        }
        out.push(Cue {
            start_s,
            end_s,
            lines: lines(cue, label, layout.max_line_chars),
            speaker,
        });
    }
}

/// Characters of `words` on one line, the label's included when it is the first line.
fn width(words: &[Timed<'_>], label: usize) -> usize {
    label + words.iter().map(|w| w.chars).sum::<usize>() + words.len().saturating_sub(1)
}

/// Whether `words` may share a line: they fit, or they are a single word.
fn fits(words: &[Timed<'_>], label: usize, max_chars: usize) -> bool {
    words.len() == 1 || width(words, label) <= max_chars
}

/// The fewest lines `words` need (filled greedily, which is optimal for that count).
fn line_count(words: &[Timed<'_>], label: usize, max_chars: usize) -> usize {
    let mut count = 0;
    let mut first = 0;
    while first < words.len() {
        let label = if count == 0 { label } else { 0 };
        let mut end = first + 1;
        while end < words.len() && fits(&words[first..=end], label, max_chars) {
            end += 1;
        }
        count += 1;
        first = end;
    }
    count
}

/// `words` in as few lines as they need, balanced: of the ways to break them into that many
/// lines, the one whose longest line is shortest (the first such, so the later lines are the
/// longer ones on a tie).
fn lines(words: &[Timed<'_>], label: usize, max_chars: usize) -> Vec<String> {
    let count = line_count(words, label, max_chars);
    let n = words.len();
    // best[l][j]: the shortest longest line laying out words[..j] in l lines, and where the
    // last of those lines starts.
    let mut best = vec![vec![None::<(usize, usize)>; n + 1]; count + 1];
    best[0][0] = Some((0, 0));
    for l in 1..=count {
        let label = if l == 1 { label } else { 0 };
        for j in l..=n {
            for i in (l - 1)..j {
                let Some((longest, _)) = best[l - 1][i] else {
                    continue;
                };
                if !fits(&words[i..j], label, max_chars) {
                    continue;
                }
                let longest = longest.max(width(&words[i..j], label));
                if best[l][j].is_none_or(|(b, _)| longest < b) {
                    best[l][j] = Some((longest, i));
                }
            }
        }
    }
    let mut breaks = vec![n];
    let mut j = n;
    for l in (1..=count).rev() {
        let Some((_, i)) = best[l][j] else {
            unreachable!("the greedy line count is feasible");
        };
        breaks.push(i);
        j = i;
    }
    breaks.reverse();
    breaks
        .windows(2)
        .map(|w| {
            words[w[0]..w[1]]
                .iter()
                .map(|w| w.text)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: Layout = Layout {
        max_ms: 7_000,
        max_line_chars: 42,
        max_lines: 2,
        label_chars: |_| 0,
    };

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
                avg_logprob: None,
                no_speech_prob: None,
            }],
            words,
        }
    }

    type Got<'a> = Vec<(f64, f64, Vec<String>, Option<&'a str>)>;

    fn got<'a>(cues: Vec<Cue<'a>>) -> Got<'a> {
        cues.into_iter()
            .map(|c| (c.start_s, c.end_s, c.lines, c.speaker))
            .collect()
    }

    fn line(text: &str) -> Vec<String> {
        text.split('\n').map(String::from).collect()
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
        assert_eq!(
            got(cues(&t, &LAYOUT)),
            vec![
                (0.0, 0.4, line("Hi um"), Some("speaker_0")),
                (0.5, 1.2, line("yes sure."), Some("speaker_1"))
            ]
        );
    }

    #[test]
    fn one_speaker_keeps_the_segment_whole() {
        let mut t = transcript(
            vec![
                word("a", 0.0, 0.2, Some("speaker_0")),
                word("b", 0.3, 0.4, Some("speaker_0")),
            ],
            Some("speaker_0"),
        );
        assert_eq!(
            got(cues(&t, &LAYOUT)),
            vec![(0.0, 0.4, line("a b"), Some("speaker_0"))]
        );
        // Words that do not spell the text: the text, timed by characters, the segment's
        // speaker on every piece.
        t.segments[0].text = "a cc".into();
        t.words[1].speaker = Some("speaker_1".into());
        assert_eq!(
            got(cues(&t, &LAYOUT)),
            vec![(0.0, 0.4, line("a cc"), Some("speaker_0"))]
        );
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
        let c = cues(&t, &LAYOUT);
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].lines.join("\n").as_str(), c[0].speaker),
            ("so a", Some("speaker_1"))
        );
        assert_eq!((c[1].start_s, c[1].speaker), (0.5, Some("speaker_0")));
    }

    /// `n` words of `chars` letters each, one every `step_s` seconds.
    fn evenly(n: usize, chars: usize, step_s: f64) -> Vec<Word> {
        (0..n)
            .map(|i| {
                let text: String =
                    std::iter::repeat_n(char::from(b'a' + (i % 26) as u8), chars).collect();
                word(&text, i as f64 * step_s, (i as f64 + 0.9) * step_s, None)
            })
            .collect()
    }

    #[test]
    fn cues_fill_two_balanced_lines() {
        // Ten 7-letter words take 79 characters: two lines of five words (39 each).
        let t = transcript(evenly(10, 7, 0.1), None);
        let c = cues(&t, &LAYOUT);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].lines.len(), 2);
        assert_eq!(
            c[0].lines.iter().map(|l| l.len()).collect::<Vec<_>>(),
            [39, 39]
        );
        // Eleven: 87 characters do not fit in 2 x 42; two cues, of six words (two lines of
        // three) and five (one line), not ten and a lone one.
        let t = transcript(evenly(11, 7, 0.1), None);
        let c = cues(&t, &LAYOUT);
        assert_eq!(
            c[0].lines,
            ["aaaaaaa bbbbbbb ccccccc", "ddddddd eeeeeee fffffff"]
        );
        assert_eq!(c[1].lines, ["ggggggg hhhhhhh iiiiiii jjjjjjj kkkkkkk"]);
        assert_eq!((ms(c[1].start_s), ms(c[1].end_s)), (600, 1_090));
    }

    #[test]
    fn cues_last_at_most_the_limit() {
        // One short word per second: 16 words need three cues of at most 7 s (seven words);
        // they get six, five and five.
        let mut t = transcript(evenly(16, 1, 1.0), None);
        t.duration_s = 20.0;
        let c = cues(&t, &LAYOUT);
        let spans: Vec<(u64, u64)> = c.iter().map(|c| (ms(c.start_s), ms(c.end_s))).collect();
        assert_eq!(spans, [(0, 5_900), (6_000, 10_900), (11_000, 15_900)]);
        assert_eq!(c[0].lines, ["a b c d e f"]);
    }

    #[test]
    fn a_long_word_gets_its_own_line_and_a_long_one_its_own_cue() {
        let long = "x".repeat(50);
        let t = transcript(
            vec![
                word("a", 0.0, 0.1, None),
                word(&long, 0.2, 0.5, None),
                word("bbbbbbbbbb", 0.6, 0.7, None),
                word("c", 0.8, 9.9, None),
            ],
            None,
        );
        let c = got(cues(&t, &LAYOUT));
        assert_eq!(
            c,
            vec![
                (0.0, 0.5, vec!["a".into(), long.clone()], None),
                (0.6, 0.7, line("bbbbbbbbbb"), None),
                // "c" lasts 9.1 s: its cue ends 7 s after it starts.
                (0.8, 7.8, line("c"), None),
            ]
        );
    }

    #[test]
    fn the_label_counts_on_the_first_line() {
        let layout = Layout {
            label_chars: |s| s.len() + 3,
            ..LAYOUT
        };
        // "[speaker_0] " takes 12: 30 characters are left on the first line. Nine 9-letter
        // words need two cues (seven at most in the first): five words and four.
        let t = transcript(
            evenly(9, 9, 0.1)
                .into_iter()
                .map(|w| Word {
                    speaker: Some("speaker_0".into()),
                    ..w
                })
                .collect(),
            Some("speaker_0"),
        );
        let c = cues(&t, &layout);
        let widths: Vec<Vec<usize>> = c
            .iter()
            .map(|c| c.lines.iter().map(|l| l.len()).collect())
            .collect();
        assert_eq!(widths, [vec![19, 29], vec![9, 29]]);
        // Without the label, the four words fit on one line.
        let widths: Vec<usize> = cues(&t, &LAYOUT).iter().map(|c| c.lines.len()).collect();
        assert_eq!(widths, [2, 1]);
    }

    #[test]
    fn without_word_timings_the_text_is_timed_by_characters() {
        let mut t = transcript(vec![word("x", 0.0, 7.9, None)], None);
        // 79 characters over 7.9 s: a tenth of a second each; word k says 1.0 k .. 1.0 k + 0.9.
        t.segments[0].text = ["abcdefghi"; 8].join(" ");
        let c = cues(&t, &LAYOUT);
        let spans: Vec<(u64, u64)> = c.iter().map(|c| (ms(c.start_s), ms(c.end_s))).collect();
        // Eight words take 7.9 s: two cues of four (39 characters, one line each).
        assert_eq!(spans, [(0, 3_900), (4_000, 7_900)]);
        assert_eq!(c[0].lines, ["abcdefghi abcdefghi abcdefghi abcdefghi"]);
        assert_eq!(c[0].lines, c[1].lines);
    }

    #[test]
    fn cue_times_stay_in_the_recording() {
        let mut t = transcript(evenly(3, 3, 1.0), None);
        t.duration_s = 2.5;
        let c = cues(&t, &LAYOUT);
        assert_eq!((c[0].start_s, c[0].end_s), (0.0, 2.5));
        t.duration_s = 1.5;
        t.segments[0].text = "a b".into(); // timed by characters: 0.0..2.9
        let c = cues(&t, &LAYOUT);
        assert_eq!((c[0].start_s, c[0].end_s), (0.0, 1.5));
    }
}

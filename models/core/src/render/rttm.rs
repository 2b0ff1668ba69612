//! RTTM (Rich Transcription Time Marked, NIST): one `SPEAKER` line per speaker turn,
//! `SPEAKER <file-id> 1 <start> <duration> <NA> <NA> <speaker> <NA> <NA>`, times in seconds
//! with three decimals, sorted by start time. No turns renders as an empty document.

use crate::speakers::SpeakerSegment;

/// RTTM fields are separated by whitespace, so the file id may not contain any.
fn file_id_field(file_id: &str) -> String {
    let id: String = file_id
        .chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect();
    if id.is_empty() {
        "audio".to_owned()
    } else {
        id
    }
}

/// The turns of `file_id` as an RTTM document (turns without length or with non-finite times
/// are left out).
pub fn rttm(file_id: &str, turns: &[SpeakerSegment]) -> String {
    let id = file_id_field(file_id);
    let mut turns: Vec<&SpeakerSegment> = turns
        .iter()
        .filter(|t| t.start_s.is_finite() && t.end_s.is_finite() && t.end_s > t.start_s)
        .collect();
    turns.sort_by(|a, b| {
        a.start_s
            .total_cmp(&b.start_s)
            .then(a.speaker.cmp(&b.speaker))
    });
    turns
        .into_iter()
        .map(|t| {
            format!(
                "SPEAKER {id} 1 {:.3} {:.3} <NA> <NA> {} <NA> <NA>\n",
                t.start_s,
                t.end_s - t.start_s,
                t.label()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(speaker: usize, start_s: f64, end_s: f64) -> SpeakerSegment {
        SpeakerSegment {
            speaker,
            start_s,
            end_s,
        }
    }

    #[test]
    fn golden() {
        let turns = [
            turn(1, 2.5, 4.25),
            turn(0, 0.08, 2.64),
            turn(0, 3.0, 3.0),
            turn(2, f64::NAN, 1.0),
        ];
        assert_eq!(
            rttm("my call", &turns),
            "SPEAKER my_call 1 0.080 2.560 <NA> <NA> speaker_0 <NA> <NA>\n\
             SPEAKER my_call 1 2.500 1.750 <NA> <NA> speaker_1 <NA> <NA>\n"
        );
        assert_eq!(rttm("x", &[]), "");
        assert!(rttm("", &turns[..1]).starts_with("SPEAKER audio 1 "));
    }

    #[test]
    fn every_line_has_ten_fields() {
        let turns: Vec<SpeakerSegment> = (0..50)
            .map(|k| {
                turn(
                    k % 4,
                    f64::from(k as u32) * 0.7,
                    f64::from(k as u32) * 0.7 + 1.3,
                )
            })
            .collect();
        let doc = rttm("a\tb", &turns);
        assert_eq!(doc.lines().count(), 50);
        for line in doc.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            assert_eq!(fields.len(), 10, "{line}");
            assert_eq!((fields[0], fields[1], fields[2]), ("SPEAKER", "a_b", "1"));
            assert!(fields[3].parse::<f64>().is_ok() && fields[4].parse::<f64>().is_ok());
        }
    }
}

//! What set a finished run's pace, told from where its jobs' time went: the line under the
//! closing stage table. A host whose cores cannot decode as fast as its GPUs transcribe (MP3,
//! AAC and Opus cost the host about four times what 16 kHz WAV does per audio second) says so,
//! and what helps.

use std::fmt;

use dispatcher::metrics::Stage;

/// Decode threads busy at least this share of the wall count as all taken.
const DECODE_SATURATED: f64 = 0.8;

/// The shortest run worth a verdict: under a second, start-up effects are all there is.
const MIN_WALL_S: f64 = 1.0;

/// A run's stage totals (stage, jobs, seconds summed over jobs) and its shape.
pub(crate) struct RunTimes<'a> {
    pub(crate) stages: &'a [(Stage, u64, f64)],
    pub(crate) wall_s: f64,
    pub(crate) decode_threads: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Limit {
    /// Every decode thread was taken and jobs queued for one.
    Decoding {
        threads: usize,
        busy: f64,
        wait_ms: f64,
        decode_ms: f64,
    },
    /// The stage with the largest share of the jobs' time (inference includes waiting for an
    /// inference slot: both are the engine's capacity).
    Stage {
        stage: Stage,
        share: f64,
        decode_busy: f64,
    },
}

/// Rules, in order:
/// 1. no finished job, or less than a second of work: nothing to tell;
/// 2. decoding, when the decode threads were busy at least 80 % of the wall and jobs waited
///    longer on average for a thread than a decode took: the host's cores set the pace;
/// 3. otherwise the stage where the jobs spent the largest share of their time.
pub(crate) fn limit(times: &RunTimes<'_>) -> Option<Limit> {
    let total = |stage: Stage| {
        times
            .stages
            .iter()
            .find(|(s, _, _)| *s == stage)
            .map_or((0, 0.0), |(_, count, sum)| (*count, *sum))
    };
    let (jobs, _) = total(Stage::EndToEnd);
    if jobs == 0 || times.wall_s < MIN_WALL_S || times.decode_threads == 0 {
        return None;
    }
    let (decodes, decode_s) = total(Stage::Decode);
    let (waits, wait_s) = total(Stage::DecodeWait);
    let decode_busy = decode_s / (times.decode_threads as f64 * times.wall_s);
    let decode_ms = 1e3 * decode_s / decodes.max(1) as f64;
    let wait_ms = 1e3 * wait_s / waits.max(1) as f64;
    if decode_busy >= DECODE_SATURATED && wait_ms > decode_ms {
        return Some(Limit::Decoding {
            threads: times.decode_threads,
            busy: decode_busy,
            wait_ms,
            decode_ms,
        });
    }
    // The stages a job passes through one after another (resampling is part of decoding;
    // diarization runs beside inference).
    let shares = [
        (Stage::Fetch, total(Stage::Fetch).1),
        (Stage::DecodeWait, wait_s),
        (Stage::Decode, decode_s),
        (
            Stage::Inference,
            total(Stage::QueueWait).1 + total(Stage::Inference).1,
        ),
        (Stage::Render, total(Stage::Render).1),
        (Stage::Upload, total(Stage::Upload).1),
    ];
    let sum: f64 = shares.iter().map(|(_, s)| s).sum();
    let (stage, seconds) = shares
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|(_, s)| *s > 0.0)?;
    Some(Limit::Stage {
        stage,
        share: seconds / sum,
        decode_busy,
    })
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Limit::Decoding {
                threads,
                busy,
                wait_ms,
                decode_ms,
            } => write!(
                f,
                "limit: decoding on this host: its {threads} decode threads were busy {:.0} % of \
                 the wall and jobs waited {wait_ms:.0} ms on average for one (a decode took \
                 {decode_ms:.0} ms); more cores, or recordings in 16 kHz WAV or FLAC, would go \
                 faster (docs/operations.md, host sizing)",
                100.0 * busy
            ),
            Limit::Stage {
                stage,
                share,
                decode_busy,
            } => {
                let what = match stage {
                    Stage::Inference => "the engine (inference and waiting for it)",
                    Stage::Fetch => "reading recordings from the store",
                    Stage::Upload => "writing results to the store",
                    Stage::Render => "rendering outputs",
                    Stage::DecodeWait => "waiting for a decode thread",
                    _ => "decoding",
                };
                write!(
                    f,
                    "limit: {what}: {:.0} % of the jobs' time; decode threads busy {:.0} % of \
                     the wall",
                    100.0 * share,
                    100.0 * decode_busy
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(stages: &[(Stage, u64, f64)], wall_s: f64) -> RunTimes<'_> {
        RunTimes {
            stages,
            wall_s,
            decode_threads: 16,
        }
    }

    /// Session 32's MP3 run on an H200 host (2 230 recordings, 7.6 s): the GPU half idle.
    #[test]
    fn a_host_that_cannot_decode_fast_enough_says_so() {
        let stages = [
            (Stage::Fetch, 2230, 12.0),
            (Stage::DecodeWait, 2230, 1878.9),
            (Stage::Decode, 2230, 111.2),
            (Stage::QueueWait, 2230, 0.0),
            (Stage::Inference, 2230, 1191.5),
            (Stage::Render, 2230, 3.2),
            (Stage::Upload, 2230, 29.1),
            (Stage::EndToEnd, 2230, 3239.1),
        ];
        let verdict = limit(&times(&stages, 7.6)).expect("a verdict");
        let Limit::Decoding {
            threads,
            busy,
            wait_ms,
            decode_ms,
        } = verdict
        else {
            panic!("expected decoding, got {verdict:?}");
        };
        assert_eq!(threads, 16);
        assert!((busy - 111.2 / (16.0 * 7.6)).abs() < 1e-9);
        assert!((wait_ms - 842.6).abs() < 0.1, "{wait_ms}");
        assert!((decode_ms - 49.9).abs() < 0.1, "{decode_ms}");
        let line = verdict.to_string();
        assert!(line.contains("16 decode threads were busy 91 %"), "{line}");
        assert!(line.contains("16 kHz WAV or FLAC"), "{line}");
    }

    /// The 96 h mix on the same host (33.3 s): decode threads 63 % busy, jobs mostly in inference.
    #[test]
    fn a_fed_engine_is_the_limit() {
        let stages = [
            (Stage::Fetch, 11158, 91.7),
            (Stage::DecodeWait, 11158, 4211.9),
            (Stage::Decode, 11158, 337.4),
            (Stage::Resample, 11158, 66.3),
            (Stage::QueueWait, 11158, 69.7),
            (Stage::Inference, 11158, 11034.6),
            (Stage::Render, 11158, 15.8),
            (Stage::Upload, 11158, 279.2),
            (Stage::EndToEnd, 11158, 16179.8),
        ];
        let verdict = limit(&times(&stages, 33.3)).expect("a verdict");
        let Limit::Stage {
            stage,
            share,
            decode_busy,
        } = verdict
        else {
            panic!("expected a stage, got {verdict:?}");
        };
        assert_eq!(stage, Stage::Inference);
        assert!((share - 11104.3 / 16040.3).abs() < 1e-3, "{share}");
        assert!((decode_busy - 0.633).abs() < 1e-3, "{decode_busy}");
        assert!(verdict.to_string().starts_with("limit: the engine"));
    }

    /// Busy decode threads with no queue for them are not the limit.
    #[test]
    fn busy_decoders_without_a_queue_are_not_the_limit() {
        let stages = [
            (Stage::DecodeWait, 100, 0.5),
            (Stage::Decode, 100, 16.0),
            (Stage::Inference, 100, 3.0),
            (Stage::Upload, 100, 40.0),
            (Stage::EndToEnd, 100, 60.0),
        ];
        let verdict = limit(&times(&stages, 1.2)).expect("a verdict");
        assert!(
            matches!(
                verdict,
                Limit::Stage {
                    stage: Stage::Upload,
                    ..
                }
            ),
            "{verdict:?}"
        );
        assert!(verdict.to_string().contains("writing results to the store"));
    }

    #[test]
    fn no_jobs_or_a_blink_of_work_tell_nothing() {
        assert_eq!(limit(&times(&[], 10.0)), None);
        let one = [(Stage::Inference, 1, 0.2), (Stage::EndToEnd, 1, 0.3)];
        assert_eq!(limit(&times(&one, 0.4)), None);
    }
}

//! Progress a person can follow: a bar on a terminal (files done and failed of the total, audio
//! hours, the rate in audio seconds per second, the time left), plain lines every few seconds
//! otherwise (logs, CI, `nohup`), and one closing line either way.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Counts at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Snapshot {
    pub(crate) done: u64,
    pub(crate) failed: u64,
    /// Audio seconds of the jobs that finished inference.
    pub(crate) audio_s: f64,
}

impl Snapshot {
    fn finished(&self) -> u64 {
        self.done + self.failed
    }
}

pub(crate) struct Progress {
    what: &'static str,
    total: Option<u64>,
    started: Instant,
    bar: Option<ProgressBar>,
    line_every: Duration,
    last_line: Instant,
}

impl Progress {
    /// A bar when stderr is a terminal, else a line every `line_every`. `total`: the files
    /// expected, when known.
    pub(crate) fn new(what: &'static str, total: Option<u64>, line_every: Duration) -> Self {
        let now = Instant::now();
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = match total {
                Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
                None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            };
            let template = match total {
                Some(_) => "{elapsed_precise} [{bar:30}] {pos}/{len} {msg} · ETA {eta}",
                None => "{elapsed_precise} {spinner} {pos} {msg}",
            };
            bar.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar
        });
        Self {
            what,
            total,
            started: now,
            bar,
            line_every,
            last_line: now,
        }
    }

    pub(crate) fn update(&mut self, snapshot: Snapshot) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(snapshot.finished());
                bar.set_message(self.counts(snapshot));
            }
            None if self.last_line.elapsed() >= self.line_every => {
                self.last_line = Instant::now();
                eprintln!("{}", self.line(snapshot));
            }
            None => {}
        }
    }

    /// The closing line (the bar, if any, is cleared first so the line stands alone), its rate
    /// over `wall` (the work's span, without the idle wait that ends a run).
    pub(crate) fn finish(mut self, snapshot: Snapshot, wall: Duration) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        self.started = Instant::now() - wall;
        eprintln!("{}", self.line(snapshot));
    }

    /// `progress: 12/40 files · done 11 · failed 1 · 0.10 h audio · 2,345 audio-s/s · ETA 3 s`
    pub(crate) fn line(&self, snapshot: Snapshot) -> String {
        let finished = snapshot.finished();
        let of_total = match self.total {
            Some(total) => format!("{finished}/{total} {}", self.what),
            None => format!("{finished} {}", self.what),
        };
        let eta = match self.total {
            Some(total) if finished > 0 && finished < total => {
                let per_file = self.started.elapsed().as_secs_f64() / finished as f64;
                format!(" · ETA {:.0} s", per_file * (total - finished) as f64)
            }
            _ => String::new(),
        };
        format!("progress: {of_total} · {}{eta}", self.counts(snapshot))
    }

    fn counts(&self, snapshot: Snapshot) -> String {
        let elapsed = self.started.elapsed().as_secs_f64();
        let rate = if elapsed > 0.0 {
            snapshot.audio_s / elapsed
        } else {
            0.0
        };
        format!(
            "done {} · failed {} · {:.2} h audio · {:.0} audio-s/s",
            snapshot.done,
            snapshot.failed,
            snapshot.audio_s / 3600.0,
            rate
        )
    }
}

/// Counts of a listing that has no known total (backfill, reconcile): a spinner with the
/// counts on a terminal; off one, the counts every 10 s (logs, cron).
pub(crate) struct Ticker {
    spinner: Option<ProgressBar>,
    last_line: Instant,
}

impl Ticker {
    pub(crate) fn new() -> Self {
        let spinner = std::io::stderr().is_terminal().then(|| {
            let spinner = ProgressBar::new_spinner();
            spinner.set_style(
                ProgressStyle::with_template("{spinner} {elapsed} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            spinner
        });
        Self {
            spinner,
            last_line: Instant::now(),
        }
    }

    pub(crate) fn show(&mut self, counts: String) {
        match &self.spinner {
            Some(spinner) => {
                spinner.set_message(counts);
                spinner.tick();
            }
            None if self.last_line.elapsed() >= Duration::from_secs(10) => {
                self.last_line = Instant::now();
                eprintln!("progress: {counts}");
            }
            None => {}
        }
    }

    pub(crate) fn finish(self) {
        if let Some(spinner) = self.spinner {
            spinner.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_count_files_audio_and_time_left() {
        let progress = Progress {
            what: "files",
            total: Some(10),
            started: Instant::now() - Duration::from_secs(4),
            bar: None,
            line_every: Duration::from_secs(10),
            last_line: Instant::now(),
        };
        let line = progress.line(Snapshot {
            done: 3,
            failed: 1,
            audio_s: 7200.0,
        });
        assert!(line.starts_with("progress: 4/10 files · done 3 · failed 1 · 2.00 h audio"));
        // 4 files in 4 s: 6 left take about 6 s.
        assert!(line.contains("· ETA 6 s"), "{line}");
        assert!(
            line.contains("1800 audio-s/s") || line.contains("1799 audio-s/s"),
            "{line}"
        );
        let unknown_total = Progress {
            total: None,
            ..progress
        };
        let line = unknown_total.line(Snapshot::default());
        assert!(line.starts_with("progress: 0 files · done 0"), "{line}");
        assert!(!line.contains("ETA"), "{line}");
    }
}

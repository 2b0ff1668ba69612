//! What `sla_sweep` writes and `sla_plot` reads: the per-round CSV rows, the latency sidecar,
//! nearest-rank percentiles, the aggregation of a level's rounds and the SLA verdicts.
//!
//! Included by both examples with `#[path = "sla/mod.rs"] mod sla;`; each uses part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The latency SLA of the seed article: mean and p99 strictly below the limits, no failure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sla {
    pub(crate) mean_ms: f64,
    pub(crate) p99_ms: f64,
}

impl Sla {
    pub(crate) fn passes(&self, stats: &Stats, failures: u64) -> bool {
        stats.count > 0
            && failures == 0
            && stats.mean_ms < self.mean_ms
            && stats.p99_ms < self.p99_ms
    }
}

/// Nearest-rank percentile of ascending `sorted` values: the smallest value with at least
/// `p` % of the values at or below it (rank `ceil(p/100 · n)`, as `benchmark_sla.py`).
pub(crate) fn percentile_nearest_rank(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = (p * n as f64 / 100.0).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// Count, mean, p50 and p99 of some latencies (ms); zeros when there are none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Stats {
    pub(crate) count: usize,
    pub(crate) mean_ms: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
}

impl Stats {
    /// Sorts `latencies_ms` in place.
    pub(crate) fn of(latencies_ms: &mut [f64]) -> Self {
        if latencies_ms.is_empty() {
            return Self::default();
        }
        latencies_ms.sort_by(f64::total_cmp);
        let sum: f64 = latencies_ms.iter().sum();
        Self {
            count: latencies_ms.len(),
            mean_ms: sum / latencies_ms.len() as f64,
            p50_ms: percentile_nearest_rank(latencies_ms, 50.0).unwrap_or(0.0),
            p99_ms: percentile_nearest_rank(latencies_ms, 99.0).unwrap_or(0.0),
        }
    }
}

/// One CSV row: one (layout, round, concurrency) measurement window.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) layout: String,
    pub(crate) round: usize,
    pub(crate) concurrency: usize,
    pub(crate) requests: u64,
    pub(crate) failures: u64,
    pub(crate) req_per_s: f64,
    pub(crate) audio_s_per_s: f64,
    pub(crate) mean_ms: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) sla_ok: bool,
    /// Start to every worker ready, of the layout's fleet.
    pub(crate) ready_s: f64,
}

pub(crate) const CSV_HEADER: &str = "layout,round,concurrency,requests,failures,req_per_s,\
                                     audio_s_per_s,mean_ms,p50_ms,p99_ms,sla_ok,ready_s";

impl Row {
    pub(crate) fn to_csv(&self) -> String {
        format!(
            "{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{},{:.3}",
            self.layout,
            self.round,
            self.concurrency,
            self.requests,
            self.failures,
            self.req_per_s,
            self.audio_s_per_s,
            self.mean_ms,
            self.p50_ms,
            self.p99_ms,
            self.sla_ok,
            self.ready_s
        )
    }

    pub(crate) fn parse(line: &str) -> Result<Self> {
        let f: Vec<&str> = line.trim().split(',').collect();
        if f.len() != 12 {
            bail!("expected 12 fields, got {}: {line:?}", f.len());
        }
        let num = |i: usize| -> Result<f64> {
            f[i].parse()
                .with_context(|| format!("field {i} of {line:?} is not a number"))
        };
        let int = |i: usize| -> Result<u64> {
            f[i].parse()
                .with_context(|| format!("field {i} of {line:?} is not an integer"))
        };
        Ok(Self {
            layout: f[0].to_owned(),
            round: int(1)? as usize,
            concurrency: int(2)? as usize,
            requests: int(3)?,
            failures: int(4)?,
            req_per_s: num(5)?,
            audio_s_per_s: num(6)?,
            mean_ms: num(7)?,
            p50_ms: num(8)?,
            p99_ms: num(9)?,
            sla_ok: f[10]
                .parse()
                .with_context(|| format!("sla_ok of {line:?} is not true/false"))?,
            ready_s: num(11)?,
        })
    }
}

/// The rows of a sweep CSV (header checked).
pub(crate) fn parse_csv(text: &str) -> Result<Vec<Row>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    match lines.next() {
        Some(header) if header.trim() == CSV_HEADER => {}
        other => bail!("not a sweep CSV: header {other:?}, expected {CSV_HEADER:?}"),
    }
    lines
        .enumerate()
        .map(|(i, l)| Row::parse(l).with_context(|| format!("row {}", i + 1)))
        .collect()
}

/// The raw latencies next to the CSV: `<csv>.latencies.csv`.
pub(crate) fn latencies_path(csv: &Path) -> PathBuf {
    let mut name = csv.as_os_str().to_owned();
    name.push(".latencies.csv");
    PathBuf::from(name)
}

pub(crate) const LATENCIES_HEADER: &str = "layout,round,concurrency,latency_ms";

/// Latencies (ms) of the requests answered in each window, keyed by (layout, concurrency);
/// rounds pooled.
pub(crate) type LevelLatencies = HashMap<(String, usize), Vec<f64>>;

pub(crate) fn parse_latencies(text: &str) -> Result<LevelLatencies> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    match lines.next() {
        Some(header) if header.trim() == LATENCIES_HEADER => {}
        other => bail!("not a latencies CSV: header {other:?}, expected {LATENCIES_HEADER:?}"),
    }
    let mut out = LevelLatencies::new();
    for line in lines {
        let f: Vec<&str> = line.trim().split(',').collect();
        let [layout, _round, concurrency, ms] = f[..] else {
            bail!("expected 4 fields: {line:?}");
        };
        let concurrency: usize = concurrency.parse().with_context(|| line.to_owned())?;
        let ms: f64 = ms.parse().with_context(|| line.to_owned())?;
        out.entry((layout.to_owned(), concurrency))
            .or_default()
            .push(ms);
    }
    Ok(out)
}

/// One concurrency level of one layout, its rounds together.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Level {
    pub(crate) layout: String,
    pub(crate) concurrency: usize,
    pub(crate) rounds: usize,
    pub(crate) requests: u64,
    pub(crate) failures: u64,
    /// Mean over the rounds.
    pub(crate) req_per_s: f64,
    /// Mean over the rounds.
    pub(crate) audio_s_per_s: f64,
    /// Over every round's latencies.
    pub(crate) mean_ms: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) sla_ok: bool,
    pub(crate) ready_s: f64,
}

/// Each (layout, concurrency) of `rows` as one [`Level`], layouts in order of first appearance
/// and levels by concurrency. Mean, p50 and p99 come from the pooled latencies of all rounds
/// when `latencies` has them; otherwise (a CSV without its sidecar) the mean is the
/// request-weighted mean of the rounds' means (the same number) and p50/p99 are the worst
/// round's (an upper bound of the pooled ones).
pub(crate) fn aggregate(rows: &[Row], latencies: Option<&LevelLatencies>, sla: Sla) -> Vec<Level> {
    let mut layouts: Vec<&str> = Vec::new();
    for row in rows {
        if !layouts.contains(&row.layout.as_str()) {
            layouts.push(&row.layout);
        }
    }
    let mut out = Vec::new();
    for layout in layouts {
        let mut levels: Vec<usize> = rows
            .iter()
            .filter(|r| r.layout == layout)
            .map(|r| r.concurrency)
            .collect();
        levels.sort_unstable();
        levels.dedup();
        for concurrency in levels {
            let of: Vec<&Row> = rows
                .iter()
                .filter(|r| r.layout == layout && r.concurrency == concurrency)
                .collect();
            let rounds = of.len();
            let requests: u64 = of.iter().map(|r| r.requests).sum();
            let failures: u64 = of.iter().map(|r| r.failures).sum();
            let mean_of = |f: fn(&Row) -> f64| of.iter().map(|r| f(r)).sum::<f64>() / rounds as f64;
            let pooled = latencies
                .and_then(|l| l.get(&(layout.to_owned(), concurrency)))
                .map(|l| Stats::of(&mut l.clone()));
            let stats = pooled.unwrap_or_else(|| {
                let worst = |f: fn(&Row) -> f64| of.iter().map(|r| f(r)).fold(0.0, f64::max);
                Stats {
                    count: requests as usize,
                    mean_ms: if requests == 0 {
                        0.0
                    } else {
                        of.iter()
                            .map(|r| r.mean_ms * r.requests as f64)
                            .sum::<f64>()
                            / requests as f64
                    },
                    p50_ms: worst(|r| r.p50_ms),
                    p99_ms: worst(|r| r.p99_ms),
                }
            });
            out.push(Level {
                layout: layout.to_owned(),
                concurrency,
                rounds,
                requests,
                failures,
                req_per_s: mean_of(|r| r.req_per_s),
                audio_s_per_s: mean_of(|r| r.audio_s_per_s),
                mean_ms: stats.mean_ms,
                p50_ms: stats.p50_ms,
                p99_ms: stats.p99_ms,
                sla_ok: sla.passes(&stats, failures),
                ready_s: mean_of(|r| r.ready_s),
            });
        }
    }
    out
}

/// The level of `levels` (one layout's) with the most req/s within the SLA; ties go to the
/// lower concurrency. `None` when no level passes.
pub(crate) fn best_within_sla<'a>(
    levels: impl IntoIterator<Item = &'a Level>,
) -> Option<&'a Level> {
    let mut best: Option<&Level> = None;
    for level in levels.into_iter().filter(|l| l.sla_ok) {
        let better = match best {
            None => true,
            Some(b) => {
                level.req_per_s > b.req_per_s
                    || (level.req_per_s == b.req_per_s && level.concurrency < b.concurrency)
            }
        };
        if better {
            best = Some(level);
        }
    }
    best
}

/// The best point within the SLA of one layout (all `None` when no level passes).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct LayoutBest {
    pub(crate) layout: String,
    pub(crate) best_req_per_s: Option<f64>,
    pub(crate) at_concurrency: Option<usize>,
    pub(crate) audio_s_per_s: Option<f64>,
    pub(crate) mean_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) ready_s: f64,
}

/// The summary line (fields serialised in this order).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Summary {
    pub(crate) layouts: Vec<LayoutBest>,
    /// The layout with the most req/s within the SLA (the first of equals).
    pub(crate) best_layout: Option<String>,
}

/// Per layout its best point within the SLA, and the layout with the most req/s.
pub(crate) fn summary(levels: &[Level]) -> Summary {
    let mut layouts: Vec<&str> = Vec::new();
    for level in levels {
        if !layouts.contains(&level.layout.as_str()) {
            layouts.push(&level.layout);
        }
    }
    let entries: Vec<LayoutBest> = layouts
        .iter()
        .map(|&layout| {
            let of: Vec<&Level> = levels.iter().filter(|l| l.layout == layout).collect();
            let ready_s = of.first().map_or(0.0, |l| l.ready_s);
            let best = best_within_sla(of.iter().copied());
            LayoutBest {
                layout: layout.to_owned(),
                best_req_per_s: best.map(|b| b.req_per_s),
                at_concurrency: best.map(|b| b.concurrency),
                audio_s_per_s: best.map(|b| b.audio_s_per_s),
                mean_ms: best.map(|b| b.mean_ms),
                p99_ms: best.map(|b| b.p99_ms),
                ready_s,
            }
        })
        .collect();
    let mut best_layout: Option<(&str, f64)> = None;
    for entry in &entries {
        if let Some(r) = entry.best_req_per_s {
            if best_layout.is_none_or(|(_, best)| r > best) {
                best_layout = Some((&entry.layout, r));
            }
        }
    }
    let best_layout = best_layout.map(|(l, _)| l.to_owned());
    Summary {
        layouts: entries,
        best_layout,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SLA: Sla = Sla {
        mean_ms: 650.0,
        p99_ms: 1000.0,
    };

    fn row(layout: &str, round: usize, c: usize, req_per_s: f64, mean: f64, p99: f64) -> Row {
        Row {
            layout: layout.into(),
            round,
            concurrency: c,
            requests: 10,
            failures: 0,
            req_per_s,
            audio_s_per_s: req_per_s * 5.0,
            mean_ms: mean,
            p50_ms: mean,
            p99_ms: p99,
            sla_ok: SLA.passes(
                &Stats {
                    count: 10,
                    mean_ms: mean,
                    p50_ms: mean,
                    p99_ms: p99,
                },
                0,
            ),
            ready_s: 12.5,
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile_nearest_rank(&v, 99.0), Some(99.0));
        assert_eq!(percentile_nearest_rank(&v, 50.0), Some(50.0));
        assert_eq!(percentile_nearest_rank(&v, 100.0), Some(100.0));
        assert_eq!(percentile_nearest_rank(&v, 0.0), Some(1.0));
        // 10 values: p99 is the largest (rank ceil(9.9) = 10), p50 the 5th.
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile_nearest_rank(&v, 99.0), Some(10.0));
        assert_eq!(percentile_nearest_rank(&v, 50.0), Some(5.0));
        // 3 values: median is the middle one, no interpolation.
        assert_eq!(percentile_nearest_rank(&[1.0, 2.0, 4.0], 50.0), Some(2.0));
        assert_eq!(percentile_nearest_rank(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile_nearest_rank(&[], 50.0), None);
        // 200 values: rank ceil(198) = 198 exactly (no float rounding up to 199).
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile_nearest_rank(&v, 99.0), Some(198.0));
    }

    #[test]
    fn stats_sort_and_summarise() {
        let mut v = vec![300.0, 100.0, 200.0, 400.0];
        let s = Stats::of(&mut v);
        assert_eq!(v, vec![100.0, 200.0, 300.0, 400.0]);
        assert_eq!(
            (s.count, s.mean_ms, s.p50_ms, s.p99_ms),
            (4, 250.0, 200.0, 400.0)
        );
        assert_eq!(Stats::of(&mut []), Stats::default());
    }

    #[test]
    fn sla_is_strict_and_needs_answers_and_no_failures() {
        let s = |mean, p99| Stats {
            count: 5,
            mean_ms: mean,
            p50_ms: mean,
            p99_ms: p99,
        };
        assert!(SLA.passes(&s(649.9, 999.9), 0));
        assert!(!SLA.passes(&s(650.0, 900.0), 0));
        assert!(!SLA.passes(&s(600.0, 1000.0), 0));
        assert!(!SLA.passes(&s(100.0, 200.0), 1));
        assert!(!SLA.passes(&Stats::default(), 0));
    }

    #[test]
    fn csv_rows_round_trip() {
        let r = row("mps4", 2, 64, 123.456, 310.5, 612.25);
        let text = format!("{CSV_HEADER}\n{}\n", r.to_csv());
        assert_eq!(parse_csv(&text).unwrap(), vec![r]);
        assert!(parse_csv("a,b\n").is_err());
        assert!(parse_csv(&format!("{CSV_HEADER}\nmps4,1,2\n")).is_err());
    }

    #[test]
    fn rounds_pool_their_latencies() {
        // Round 1 fast, round 2 has the one slow request: pooled p99 over 100 latencies.
        let rows = vec![
            row("a", 1, 4, 10.0, 100.0, 100.0),
            row("a", 2, 4, 20.0, 100.0, 1500.0),
        ];
        let mut lat = LevelLatencies::new();
        let mut v = vec![100.0; 99];
        v.push(1500.0);
        lat.insert(("a".into(), 4), v);
        let levels = aggregate(&rows, Some(&lat), SLA);
        assert_eq!(levels.len(), 1);
        let l = &levels[0];
        assert_eq!((l.rounds, l.requests, l.req_per_s), (2, 20, 15.0));
        assert_eq!(l.p99_ms, 100.0, "99 of 100 at 100 ms: p99 is 100 ms");
        assert!((l.mean_ms - 114.0).abs() < 1e-9);
        assert!(l.sla_ok);
        // Without the sidecar: weighted mean, worst round's p99 (here above the limit).
        let levels = aggregate(&rows, None, SLA);
        assert_eq!(levels[0].mean_ms, 100.0);
        assert_eq!(levels[0].p99_ms, 1500.0);
        assert!(!levels[0].sla_ok);
    }

    #[test]
    fn aggregate_orders_layouts_by_appearance_and_levels_by_concurrency() {
        let rows = vec![
            row("b", 1, 16, 1.0, 1.0, 1.0),
            row("b", 1, 2, 1.0, 1.0, 1.0),
            row("a", 1, 1, 1.0, 1.0, 1.0),
        ];
        let keys: Vec<(String, usize)> = aggregate(&rows, None, SLA)
            .into_iter()
            .map(|l| (l.layout, l.concurrency))
            .collect();
        assert_eq!(
            keys,
            vec![("b".into(), 2), ("b".into(), 16), ("a".into(), 1)]
        );
    }

    #[test]
    fn failures_fail_the_level() {
        let mut bad = row("a", 2, 8, 50.0, 100.0, 200.0);
        bad.failures = 1;
        let levels = aggregate(&[row("a", 1, 8, 50.0, 100.0, 200.0), bad], None, SLA);
        assert_eq!(levels[0].failures, 1);
        assert!(!levels[0].sla_ok);
    }

    #[test]
    fn best_point_is_the_fastest_passing_level() {
        let rows = vec![
            row("single", 1, 1, 10.0, 100.0, 150.0),
            row("single", 1, 8, 40.0, 400.0, 900.0),
            row("single", 1, 16, 60.0, 700.0, 1200.0), // fastest but misses the SLA
            row("mps4", 1, 8, 45.0, 300.0, 500.0),
            row("mps4", 1, 32, 90.0, 600.0, 990.0),
            row("mps4", 1, 64, 90.0, 640.0, 999.0), // tie: the lower concurrency wins
            row("broken", 1, 1, 5.0, 2000.0, 3000.0),
        ];
        let levels = aggregate(&rows, None, SLA);
        let best = |layout: &str| {
            best_within_sla(levels.iter().filter(|l| l.layout == layout))
                .map(|l| (l.concurrency, l.req_per_s))
        };
        assert_eq!(best("single"), Some((8, 40.0)));
        assert_eq!(best("mps4"), Some((32, 90.0)));
        assert_eq!(best("broken"), None);
        let s = serde_json::to_value(summary(&levels)).unwrap();
        assert_eq!(s["best_layout"], "mps4");
        assert_eq!(s["layouts"][0]["layout"], "single");
        assert_eq!(s["layouts"][0]["at_concurrency"], 8);
        assert_eq!(s["layouts"][1]["best_req_per_s"], 90.0);
        assert_eq!(s["layouts"][1]["ready_s"], 12.5);
        assert!(s["layouts"][2]["best_req_per_s"].is_null());
        assert_eq!(summary(&aggregate(&rows[6..], None, SLA)).best_layout, None);
        // The summary line keeps the documented field order.
        let line = serde_json::to_string(&summary(&levels)).unwrap();
        assert!(line.starts_with(
            r#"{"layouts":[{"layout":"single","best_req_per_s":40.0,"at_concurrency":8,"#
        ));
        assert!(line.ends_with(r#""best_layout":"mps4"}"#));
    }

    #[test]
    fn latencies_sidecar_pools_rounds() {
        let text = format!("{LATENCIES_HEADER}\ncpu1,1,2,10.5\ncpu1,2,2,20\ncpu2,1,2,7\n");
        let lat = parse_latencies(&text).unwrap();
        assert_eq!(lat[&("cpu1".to_owned(), 2)], vec![10.5, 20.0]);
        assert_eq!(lat[&("cpu2".to_owned(), 2)], vec![7.0]);
        assert_eq!(
            latencies_path(Path::new("/tmp/s.csv")),
            PathBuf::from("/tmp/s.csv.latencies.csv")
        );
    }
}

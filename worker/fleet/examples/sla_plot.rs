//! The plot of an `sla_sweep` CSV: one PNG, two panels side by side.
//!
//! - left: requests/s (mean over rounds) against concurrency, one line per layout; a filled
//!   marker where the level meets the SLA, a hollow one where it does not;
//! - right: p99 latency against concurrency (both axes logarithmic), one line per layout, the
//!   p99 limit as a red line with the region above it shaded, the mean limit dashed.
//!
//! A level's rounds are pooled as in the sweep: mean and p99 over all their latencies, from
//! `<csv>.latencies.csv` (without it: the request-weighted mean of the rounds' means and the
//! worst round's p99, said on stderr). Prints the sweep's JSON summary line for the rows read,
//! so the CSVs of several runs (one header, then every run's rows; the same for the latencies)
//! can be plotted and summarised together.
//!
//! ```text
//! sla_plot --csv sla.csv --out-png sla.png [--title T] [--font /path/to/Font.ttf]
//! ```

#[path = "sla/mod.rs"]
mod sla;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use sla::{Level, Sla};

#[derive(Debug, Parser)]
struct Args {
    /// The sweep's `--out-csv`.
    #[arg(long)]
    csv: PathBuf,
    /// Raw latencies (default: `<csv>.latencies.csv`, when it exists).
    #[arg(long)]
    latencies: Option<PathBuf>,
    /// The PNG (default: the CSV's path with `.png`).
    #[arg(long)]
    out_png: Option<PathBuf>,
    #[arg(long, default_value_t = 1400)]
    width_px: u32,
    #[arg(long, default_value_t = 600)]
    height_px: u32,
    /// Default: "Parakeet fleet: throughput and p99 vs concurrency (SLA: mean < 650 ms,
    /// p99 < 1000 ms)", with the SLA flags' values.
    #[arg(long)]
    title: Option<String>,
    /// A TTF or OTF font for every text.
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    font: PathBuf,
    #[arg(long, default_value_t = 650.0)]
    sla_mean_ms: f64,
    #[arg(long, default_value_t = 1000.0)]
    sla_p99_ms: f64,
}

/// Line colours of the layouts, in order (then the palette repeats).
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
];

/// Loads `path` as the "sans-serif" family (plotters' default), every style.
fn register(path: &Path) -> Result<()> {
    if !path.is_file() {
        bail!(
            "font {} not found: give --font PATH to a .ttf (Debian/Ubuntu: \
             apt-get install -y fonts-dejavu-core)",
            path.display()
        );
    }
    let bytes: &'static [u8] = Box::leak(
        std::fs::read(path)
            .with_context(|| format!("reading font {}", path.display()))?
            .into_boxed_slice(),
    );
    for style in [FontStyle::Normal, FontStyle::Bold] {
        register_font("sans-serif", style, bytes)
            .map_err(|_| anyhow!("{} is not a usable TTF/OTF font", path.display()))?;
    }
    Ok(())
}

/// The powers of `base` within `lo..=hi`, and `hi`'s range widened to hold at least one.
fn powers_within(base: f64, lo: f64, hi: f64) -> Vec<f64> {
    let mut v = base.powf(lo.log(base).floor());
    let mut out = Vec::new();
    while v <= hi * (1.0 + 1e-9) {
        if v >= lo * (1.0 - 1e-9) {
            out.push(v);
        }
        v *= base;
    }
    out
}

/// 1-2-5 ticks within `lo..=hi` (a log axis of milliseconds).
fn ticks_125(lo: f64, hi: f64) -> Vec<f64> {
    powers_within(10.0, lo / 10.0, hi * 10.0)
        .into_iter()
        .flat_map(|d| [d, 2.0 * d, 5.0 * d])
        .filter(|&v| v >= lo && v <= hi)
        .collect()
}

/// Log-axis bounds with a margin: `lo / pad ..= hi · pad`.
fn log_bounds(values: impl IntoIterator<Item = f64>, pad: f64) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold(None, |acc: Option<(f64, f64)>, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })?;
    Some((lo / pad, hi * pad))
}

fn label_ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{} s", v / 1000.0)
    } else {
        format!("{v} ms")
    }
}

fn draw(args: &Args, levels: &[Level], sla: Sla, out: &Path) -> Result<()> {
    let mut layouts: Vec<&str> = Vec::new();
    for level in levels {
        if !layouts.contains(&level.layout.as_str()) {
            layouts.push(&level.layout);
        }
    }
    let colour = |i: usize| COLOURS[i % COLOURS.len()];
    let title = args.title.clone().unwrap_or_else(|| {
        format!(
            "Parakeet fleet: throughput and p99 vs concurrency (SLA: mean < {} ms, p99 < {} ms)",
            sla.mean_ms, sla.p99_ms
        )
    });

    let root = BitMapBackend::new(out, (args.width_px, args.height_px)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&title, ("sans-serif", 22))?;
    let (left, right) = root.split_horizontally(args.width_px / 2);

    let (x_lo, x_hi) = log_bounds(levels.iter().map(|l| l.concurrency as f64), 1.3)
        .ok_or_else(|| anyhow!("no concurrency levels in the CSV"))?;
    let x_ticks = powers_within(2.0, x_lo, x_hi);
    let x_axis = || (x_lo..x_hi).log_scale().with_key_points(x_ticks.clone());
    let x_label = "concurrency (closed-loop clients, log scale)";
    // Filled where the level meets the SLA; hollow (white inside, over the line) where not.
    let marker = |x: f64, y: f64, c: RGBColor, ok: bool| {
        let fill = if ok { c.filled() } else { WHITE.filled() };
        EmptyElement::at((x, y))
            + Circle::new((0, 0), 6, fill)
            + Circle::new((0, 0), 6, c.stroke_width(2))
    };

    // Left: throughput.
    let y_max = levels
        .iter()
        .map(|l| l.req_per_s)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.12;
    let mut chart = ChartBuilder::on(&left)
        .caption("throughput (mean over rounds)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(x_axis(), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("requests / s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;
    for (i, &layout) in layouts.iter().enumerate() {
        let c = colour(i);
        let of = || levels.iter().filter(move |l| l.layout == layout);
        let points: Vec<(f64, f64)> = of().map(|l| (l.concurrency as f64, l.req_per_s)).collect();
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(2)))?
            .label(layout)
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (22, 0)], c.stroke_width(2))
                    + Circle::new((11, 0), 4, c.filled())
            });
        chart.draw_series(of().map(|l| marker(l.concurrency as f64, l.req_per_s, c, l.sla_ok)))?;
    }
    let key = RGBColor(60, 60, 60);
    chart
        .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
        .label("filled: meets SLA")
        .legend(move |(x, y)| Circle::new((x + 11, y), 5, key.filled()));
    chart
        .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
        .label("hollow: misses SLA")
        .legend(move |(x, y)| {
            EmptyElement::at((x + 11, y))
                + Circle::new((0, 0), 5, WHITE.filled())
                + Circle::new((0, 0), 5, key.stroke_width(2))
        });
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()?;

    // Right: p99 latency, log scale, the SLA region above the p99 limit.
    let latency_points = || levels.iter().filter(|l| l.requests > 0 && l.p99_ms > 0.0);
    let (y_lo, y_hi) = log_bounds(
        latency_points()
            .map(|l| l.p99_ms)
            .chain([sla.mean_ms, sla.p99_ms]),
        1.6,
    )
    .ok_or_else(|| anyhow!("no positive latencies or SLA limits"))?;
    // Headroom above for the legend (upper left: low concurrency, where latencies are low).
    let y_hi = y_hi * 1.8;
    let y_ticks = ticks_125(y_lo, y_hi);
    let mut chart = ChartBuilder::on(&right)
        .caption("p99 latency (rounds pooled)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(x_axis(), (y_lo..y_hi).log_scale().with_key_points(y_ticks))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("p99 latency (log scale)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| label_ms(*y))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(x_lo, sla.p99_ms), (x_hi, y_hi)],
            red.mix(0.10).filled(),
        )))?
        .label(format!("p99 ≥ {} ms: misses SLA", sla.p99_ms))
        .legend(move |(x, y)| {
            Rectangle::new([(x, y - 6), (x + 22, y + 6)], red.mix(0.25).filled())
        });
    chart
        .draw_series(LineSeries::new(
            [(x_lo, sla.p99_ms), (x_hi, sla.p99_ms)],
            red.stroke_width(2),
        ))?
        .label(format!("p99 limit {} ms", sla.p99_ms))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], red.stroke_width(2)));
    let dark = RGBColor(90, 90, 90);
    chart
        .draw_series(DashedLineSeries::new(
            [(x_lo, sla.mean_ms), (x_hi, sla.mean_ms)],
            8,
            6,
            dark.stroke_width(2),
        ))?
        .label(format!("mean limit {} ms", sla.mean_ms))
        .legend(move |(x, y)| {
            EmptyElement::at((x, y))
                + PathElement::new(vec![(0, 0), (8, 0)], dark.stroke_width(2))
                + PathElement::new(vec![(14, 0), (22, 0)], dark.stroke_width(2))
        });
    for (i, &layout) in layouts.iter().enumerate() {
        let c = colour(i);
        let points: Vec<(f64, f64)> = latency_points()
            .filter(|l| l.layout == layout)
            .map(|l| (l.concurrency as f64, l.p99_ms))
            .collect();
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(2)))?
            .label(layout)
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (22, 0)], c.stroke_width(2))
                    + Circle::new((11, 0), 4, c.filled())
            });
        chart.draw_series(
            latency_points()
                .filter(|l| l.layout == layout)
                .map(|l| marker(l.concurrency as f64, l.p99_ms, c, l.sla_ok)),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    root.present()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let sla = Sla {
        mean_ms: args.sla_mean_ms,
        p99_ms: args.sla_p99_ms,
    };
    if [sla.mean_ms, sla.p99_ms]
        .iter()
        .any(|v| !v.is_finite() || *v <= 0.0)
    {
        bail!("the SLA limits must be positive");
    }
    register(&args.font)?;
    let text = std::fs::read_to_string(&args.csv)
        .with_context(|| format!("reading {}", args.csv.display()))?;
    let rows = sla::parse_csv(&text).with_context(|| args.csv.display().to_string())?;
    if rows.is_empty() {
        bail!("{}: no rows", args.csv.display());
    }
    let latencies_path = args
        .latencies
        .clone()
        .unwrap_or_else(|| sla::latencies_path(&args.csv));
    let latencies = if args.latencies.is_some() || latencies_path.is_file() {
        let text = std::fs::read_to_string(&latencies_path)
            .with_context(|| format!("reading {}", latencies_path.display()))?;
        Some(sla::parse_latencies(&text).with_context(|| latencies_path.display().to_string())?)
    } else {
        eprintln!(
            "{} not found: p50/p99 of a level are its worst round's",
            latencies_path.display()
        );
        None
    };
    let levels = sla::aggregate(&rows, latencies.as_ref(), sla);
    let out = args
        .out_png
        .clone()
        .unwrap_or_else(|| args.csv.with_extension("png"));
    draw(&args, &levels, sla, &out)?;
    eprintln!("wrote {}", out.display());
    // The sweep's summary line again, over every row given (e.g. CSVs of several runs joined).
    println!("{}", serde_json::to_string(&sla::summary(&levels))?);
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn axis_ticks() {
        assert_eq!(
            powers_within(2.0, 1.0 / 1.3, 256.0 * 1.3),
            vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]
        );
        assert_eq!(ticks_125(80.0, 1600.0), vec![100.0, 200.0, 500.0, 1000.0]);
        assert_eq!(log_bounds([0.0, 2.0, 8.0], 2.0), Some((1.0, 16.0)));
        assert_eq!(log_bounds([0.0], 2.0), None);
        assert_eq!(label_ms(500.0), "500 ms");
        assert_eq!(label_ms(2000.0), "2 s");
    }
}

//! The seed article's latency-SLA sweep against a fleet, for the GPU machine: which worker
//! layout serves the most requests per second with a mean latency under 650 ms and a p99
//! under 1 s.
//!
//! For each layout of `--layouts` (`single`: 1 worker, no MPS; `timesliceN`: N workers, no
//! MPS; `mpsN`: N workers under MPS at 100/N % each; `cpuN`: N CPU workers, for smoke runs
//! with `--cpu-instances`; `api`: no fleet of its own, each request is the clip's WAV file
//! posted to a running `dispatcher serve` at `--api-url`, as OpenAI's client would), per GPU
//! of `--gpus`:
//!
//! 1. the fleet starts in `<runtime-dir>/<layout>` and the time until every worker is ready
//!    is recorded;
//! 2. for each of `--rounds` rounds and each `--concurrency` level `c`: a closed loop of `c`
//!    threads, each sending one clip (picked uniformly at random, seeded) and the next as soon
//!    as the answer arrives; `--warmup-s` of requests not counted, then `--level-s` measured:
//!    the latencies (submission to answer) of the requests answered in that window;
//! 3. the fleet stops (and the MPS daemons it started) before the next layout.
//!
//! Output: one CSV row per (layout, round, concurrency) in `--out-csv` (requests, failures,
//! req/s, audio-s/s, mean/p50/p99 by nearest rank, whether the SLA held), the raw latencies in
//! `<out-csv>.latencies.csv` (for `sla_plot`), a progress line per level on stderr, and at the
//! end per layout the best req/s within the SLA (a level's rounds pooled: mean and p99 over
//! all their latencies, req/s the mean over rounds) and one JSON summary line on stdout, also
//! written to `<out-csv>.summary.json`. Exits non-zero if any request failed.
//!
//! ```text
//! sla_sweep --engine cuda --model M.nemo --clips a.wav,b.wav --gpus 0 --worker-binary ./worker \
//!           --runtime-dir /tmp/sla --out-csv sla.csv
//! sla_sweep --engine cpu --model M.nemo --clips a.wav --cpu-instances 1 --layouts cpu1,cpu2 \
//!           --concurrency 1,2,4 --rounds 2 --level-s 2 --warmup-s 0.5 --out-csv /tmp/sweep.csv
//! ```

#[path = "sla/mod.rs"]
mod sla;

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use worker_fleet::{Fleet, FleetConfig, FleetOptions};

use sla::{Level, LevelLatencies, Row, Sla, Stats};
use worker_protocol::EngineKind;

#[derive(Debug, Parser)]
struct Args {
    /// `worker serve --engine` of every worker.
    #[arg(long, default_value = "cuda", value_enum)]
    engine: EngineKind,
    #[arg(long)]
    model: PathBuf,
    /// 16 kHz mono 16-bit WAV files; each request picks one uniformly at random.
    #[arg(long, value_delimiter = ',', required = true)]
    clips: Vec<PathBuf>,
    /// Worker layouts, each started on every GPU of `--gpus`: `single`, `timesliceN`, `mpsN`
    /// (N workers at 100/N % under MPS), or `cpuN` with `--cpu-instances`; or `api` (the
    /// server at `--api-url`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "single,timeslice4,mps2,mps4,mps8"
    )]
    layouts: Vec<Layout>,
    /// Closed-loop concurrency levels (threads, one request in flight each).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64,100,128,160,192,256"
    )]
    concurrency: Vec<usize>,
    /// Passes over every concurrency level, per layout.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Measured seconds per level and round.
    #[arg(long, default_value_t = 4.0)]
    level_s: f64,
    /// Seconds of requests sent but not counted before each measured window.
    #[arg(long, default_value_t = 1.0)]
    warmup_s: f64,
    /// Start to every worker ready, at most, per layout.
    #[arg(long, default_value_t = 600)]
    ready_timeout_s: u64,
    /// Pause after stopping a layout's fleet, for its processes and MPS daemons to go.
    #[arg(long, default_value_t = 3.0)]
    settle_s: f64,
    /// One row per (layout, round, concurrency); also `<this>.latencies.csv` and
    /// `<this>.summary.json`.
    #[arg(long, default_value = "sla_sweep.csv")]
    out_csv: PathBuf,
    /// SLA: mean latency strictly below this.
    #[arg(long, default_value_t = 650.0)]
    sla_mean_ms: f64,
    /// SLA: p99 latency (nearest rank) strictly below this.
    #[arg(long, default_value_t = 1000.0)]
    sla_p99_ms: f64,
    /// Seed of the clip choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Layout `api`: the base URL of a running `dispatcher serve` (e.g. http://127.0.0.1:8000).
    #[arg(long)]
    api_url: Option<String>,
    /// Layout `api`: the bearer key, if the server wants one.
    #[arg(long, env = "SLA_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Layout `api`: the `model` field sent.
    #[arg(long, default_value = "whisper-1")]
    api_model: String,
    #[command(flatten)]
    fleet: FleetOptions,
}

/// How many workers per group, and whether under MPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// 1 worker, no MPS.
    Single,
    /// N workers time-slicing the GPU, no MPS.
    Timeslice(usize),
    /// N workers under MPS, 100/N % of the SMs each.
    Mps(usize),
    /// N CPU workers.
    Cpu(usize),
    /// A running `dispatcher serve` (`--api-url`), over HTTP.
    Api,
}

impl Layout {
    fn instances(self) -> usize {
        match self {
            Layout::Single => 1,
            Layout::Timeslice(n) | Layout::Mps(n) | Layout::Cpu(n) => n,
            Layout::Api => 0,
        }
    }

    fn mps(self) -> bool {
        matches!(self, Layout::Mps(_))
    }
}

impl FromStr for Layout {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let count = |rest: &str| match rest.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "{s:?}: the worker count must be a positive integer"
            )),
        };
        if s == "single" {
            Ok(Layout::Single)
        } else if s == "api" {
            Ok(Layout::Api)
        } else if let Some(rest) = s.strip_prefix("timeslice") {
            count(rest).map(Layout::Timeslice)
        } else if let Some(rest) = s.strip_prefix("mps") {
            count(rest).map(Layout::Mps)
        } else if let Some(rest) = s.strip_prefix("cpu") {
            count(rest).map(Layout::Cpu)
        } else {
            Err(format!(
                "{s:?}: expected single, timesliceN, mpsN, cpuN or api"
            ))
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Single => write!(f, "single"),
            Layout::Timeslice(n) => write!(f, "timeslice{n}"),
            Layout::Mps(n) => write!(f, "mps{n}"),
            Layout::Cpu(n) => write!(f, "cpu{n}"),
            Layout::Api => write!(f, "api"),
        }
    }
}

/// The fleet of one layout: the parsed options with this layout's runtime directory, MPS and
/// instance count (set on the groups, whatever shape `--instances-per-gpu` has).
fn layout_config(args: &Args, layout: Layout) -> Result<FleetConfig> {
    let cpu_mode = args.fleet.cpu_instances.is_some();
    if cpu_mode != matches!(layout, Layout::Cpu(_)) {
        bail!("layout {layout}: cpuN layouts need --cpu-instances (CPU mode), the others --gpus");
    }
    let mut options = args.fleet.clone();
    // Given, so that the fleet neither probes the GPU to choose a count nor drops MPS for a
    // lone worker; the groups get the layout's count below in any case.
    options.instances_per_gpu = Some(layout.instances());
    options.no_mps = !layout.mps();
    options.mps_thread_percentage = None;
    let base = options
        .runtime_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("parakeet-fleet"));
    options.runtime_dir = Some(base.join(layout.to_string()));
    let mut config = options.to_config(args.engine, &args.model)?;
    for group in &mut config.groups {
        group.instances = layout.instances();
        if !layout.mps() {
            group.mps = None;
        }
        match &mut group.mps {
            // 100 / N of the group's instances.
            Some(mps) => mps.active_thread_percentage = None,
            None if layout.mps() => bail!("layout {layout}: the fleet options gave no MPS"),
            None => {}
        }
    }
    config.validate().map_err(anyhow::Error::msg)?;
    Ok(config)
}

/// splitmix64: the seeds of the per-thread generators.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xorshift64*: the clip choices of one thread.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut s = seed;
        Self(splitmix64(&mut s) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0), by rejection.
    fn below(&mut self, n: usize) -> usize {
        let n = n as u64;
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return (x % n) as usize;
            }
        }
    }
}

/// A seed per (seed, layout index, round, concurrency, thread).
fn thread_seed(seed: u64, parts: [u64; 4]) -> u64 {
    let mut state = seed;
    let mut out = splitmix64(&mut state);
    for p in parts {
        state ^= p.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        out ^= splitmix64(&mut state);
    }
    out
}

/// Posts the clips' WAV files to `POST /v1/audio/transcriptions`, as OpenAI's client would
/// (multipart, `response_format` json): one connection per closed-loop thread, kept alive.
struct ApiClient {
    agent: ureq::Agent,
    url: String,
    key: Option<String>,
    /// Per clip, the whole multipart body.
    bodies: Vec<Vec<u8>>,
}

const BOUNDARY: &str = "sla-sweep-form-boundary";

impl ApiClient {
    fn new(args: &Args, base_url: &str) -> Result<Self> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(120)))
            .max_idle_connections(1024)
            .max_idle_connections_per_host(1024)
            .build()
            .into();
        let bodies = args
            .clips
            .iter()
            .map(|path| {
                let wav = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                let mut body = format!(
                    "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{}\r\n\
                     --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"clip.wav\"\r\n\
                     Content-Type: audio/wav\r\n\r\n",
                    args.api_model
                )
                .into_bytes();
                body.extend_from_slice(&wav);
                body.extend(format!("\r\n--{BOUNDARY}--\r\n").bytes());
                Ok(body)
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            agent,
            url: format!("{}/v1/audio/transcriptions", base_url.trim_end_matches('/')),
            key: args.api_key.clone(),
            bodies,
        })
    }

    fn transcribe(&self, clip: usize) -> std::result::Result<(), String> {
        let mut request = self.agent.post(&self.url).header(
            "Content-Type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        );
        if let Some(key) = &self.key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        let mut response = request
            .send(&self.bodies[clip][..])
            .map_err(|e| e.to_string())?;
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        if text.starts_with("{\"text\"") {
            Ok(())
        } else {
            Err(format!("unexpected answer: {text}"))
        }
    }
}

fn read_wav(path: &Path) -> Result<Vec<f32>> {
    let mut reader = hound::WavReader::open(path).with_context(|| path.display().to_string())?;
    let spec = reader.spec();
    if spec.channels != 1 || spec.sample_rate != 16_000 || spec.bits_per_sample != 16 {
        bail!("{}: need 16 kHz mono PCM16, got {spec:?}", path.display());
    }
    reader
        .samples::<i16>()
        .map(|s| Ok(f32::from(s?) / 32768.0))
        .collect()
}

/// What one measured window saw.
#[derive(Debug, Default)]
struct Window {
    /// Latencies (ms) of the requests answered in the window.
    latencies_ms: Vec<f64>,
    /// Audio seconds of those requests.
    audio_s: f64,
    /// Requests that failed in the window.
    failures: u64,
    /// Requests that failed during the warm-up or after the window (not in the row).
    failures_outside: u64,
}

/// `concurrency` threads in a closed loop for `warmup` then `measured`; each counts the
/// requests it saw answered inside the measured window. Returns when every thread has its last
/// answer (at most one request past the window each).
fn run_level(
    send: &(dyn Fn(usize) -> std::result::Result<(), String> + Sync),
    clips: &[Vec<f32>],
    concurrency: usize,
    warmup: Duration,
    measured: Duration,
    seed: impl Fn(usize) -> u64 + Sync,
) -> Window {
    let start = Instant::now();
    let from = start + warmup;
    let until = from + measured;
    let windows: Vec<Window> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..concurrency)
            .map(|t| {
                let seed = &seed;
                scope.spawn(move || {
                    let mut rng = Rng::new(seed(t));
                    let mut w = Window::default();
                    while Instant::now() < until {
                        let c = rng.below(clips.len());
                        let sent = Instant::now();
                        let answer = send(c);
                        let done = Instant::now();
                        let inside = done >= from && done <= until;
                        match answer {
                            Ok(_) if inside => {
                                w.latencies_ms.push((done - sent).as_secs_f64() * 1e3);
                                w.audio_s += clips[c].len() as f64 / 16_000.0;
                            }
                            Ok(_) => {}
                            Err(error) => {
                                if inside {
                                    w.failures += 1;
                                } else {
                                    w.failures_outside += 1;
                                }
                                eprintln!("FAILED clip {c}: {error}");
                            }
                        }
                    }
                    w
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_default())
            .collect()
    });
    let mut all = Window::default();
    for w in windows {
        all.latencies_ms.extend(w.latencies_ms);
        all.audio_s += w.audio_s;
        all.failures += w.failures;
        all.failures_outside += w.failures_outside;
    }
    all
}

/// The CSV row of one window (sorts its latencies).
fn window_row(
    layout: &str,
    round: usize,
    concurrency: usize,
    window: &mut Window,
    measured_s: f64,
    ready_s: f64,
    sla: Sla,
) -> Row {
    let stats = Stats::of(&mut window.latencies_ms);
    Row {
        layout: layout.to_owned(),
        round,
        concurrency,
        requests: stats.count as u64,
        failures: window.failures,
        req_per_s: stats.count as f64 / measured_s,
        audio_s_per_s: window.audio_s / measured_s,
        mean_ms: stats.mean_ms,
        p50_ms: stats.p50_ms,
        p99_ms: stats.p99_ms,
        sla_ok: sla.passes(&stats, window.failures),
        ready_s,
    }
}

fn summary_path(csv: &Path) -> PathBuf {
    let mut name = csv.as_os_str().to_owned();
    name.push(".summary.json");
    PathBuf::from(name)
}

/// The human-readable best point of each layout.
fn best_lines(levels: &[Level], sla: Sla) -> Vec<String> {
    let mut layouts: Vec<&str> = Vec::new();
    for level in levels {
        if !layouts.contains(&level.layout.as_str()) {
            layouts.push(&level.layout);
        }
    }
    layouts
        .into_iter()
        .map(|layout| {
            let of = levels.iter().filter(|l| l.layout == layout);
            match sla::best_within_sla(of) {
                Some(b) => format!(
                    "{layout}: best {:.1} req/s within the SLA at concurrency {} \
                     ({:.1} audio-s/s, mean {:.0} ms, p99 {:.0} ms)",
                    b.req_per_s, b.concurrency, b.audio_s_per_s, b.mean_ms, b.p99_ms
                ),
                None => format!(
                    "{layout}: no level within the SLA (mean < {} ms, p99 < {} ms)",
                    sla.mean_ms, sla.p99_ms
                ),
            }
        })
        .collect()
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        bail!("--concurrency: positive levels, at least one");
    }
    let positive = |s: f64| s.is_finite() && s > 0.0;
    if args.rounds == 0
        || !positive(args.level_s)
        || !(args.warmup_s == 0.0 || positive(args.warmup_s))
    {
        bail!("--rounds and --level-s must be positive, --warmup-s not negative");
    }
    if args.fleet.no_mps || args.fleet.mps_thread_percentage.is_some() {
        eprintln!(
            "note: --no-mps and --mps-thread-percentage are ignored: each layout sets MPS \
             (mpsN: 100/N %), and the worker count (--instances-per-gpu too)"
        );
    }
    let sla = Sla {
        mean_ms: args.sla_mean_ms,
        p99_ms: args.sla_p99_ms,
    };
    // Every layout's configuration before anything starts: a bad name fails now.
    let configs: Vec<(Layout, Option<FleetConfig>)> = args
        .layouts
        .iter()
        .map(|&l| match l {
            Layout::Api => Ok((l, None)),
            _ => Ok((l, Some(layout_config(&args, l)?))),
        })
        .collect::<Result<_>>()?;
    let api = match (args.layouts.contains(&Layout::Api), &args.api_url) {
        (false, _) => None,
        (true, None) => bail!("layout api needs --api-url"),
        (true, Some(url)) => Some(ApiClient::new(&args, url)?),
    };
    let clips: Vec<Vec<f32>> = args
        .clips
        .iter()
        .map(|p| read_wav(p))
        .collect::<Result<_>>()?;
    if clips.iter().any(Vec::is_empty) {
        bail!("a clip has no samples");
    }

    let open = |path: &Path, header: &str| -> Result<BufWriter<File>> {
        let mut w = BufWriter::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        writeln!(w, "{header}")?;
        Ok(w)
    };
    let latencies_path = sla::latencies_path(&args.out_csv);
    let mut csv = open(&args.out_csv, sla::CSV_HEADER)?;
    let mut latencies_csv = open(&latencies_path, sla::LATENCIES_HEADER)?;

    let warmup = Duration::from_secs_f64(args.warmup_s);
    let measured = Duration::from_secs_f64(args.level_s);
    let mut rows: Vec<Row> = Vec::new();
    let mut latencies = LevelLatencies::new();
    let mut failures_outside = 0;
    let sweep_started = Instant::now();
    for (index, (layout, config)) in configs.into_iter().enumerate() {
        let name = layout.to_string();
        let (fleet, ready_s) = match config {
            Some(config) => {
                eprintln!(
                    "[{name}] starting {} worker(s) per group, {} (runtime dir {})",
                    layout.instances(),
                    if layout.mps() { "under MPS" } else { "no MPS" },
                    config.runtime_dir.display()
                );
                let started = Instant::now();
                let fleet = Fleet::start(config).with_context(|| format!("{name}: starting"))?;
                fleet
                    .wait_all_ready(Duration::from_secs(args.ready_timeout_s))
                    .with_context(|| format!("{name}: waiting for every worker"))?;
                let ready_s = started.elapsed().as_secs_f64();
                eprintln!("[{name}] every worker ready after {ready_s:.1} s");
                (Some(fleet), ready_s)
            }
            None => (None, 0.0),
        };
        let send = |c: usize| -> std::result::Result<(), String> {
            match (&fleet, &api) {
                (Some(fleet), _) => fleet
                    .transcribe(&[clips[c].as_slice()])
                    .remove(0)
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                (None, Some(api)) => api.transcribe(c),
                (None, None) => Err("no fleet and no API (bug)".into()),
            }
        };

        for round in 1..=args.rounds {
            for &c in &args.concurrency {
                let seed = |t: usize| {
                    thread_seed(args.seed, [index as u64, round as u64, c as u64, t as u64])
                };
                let mut window = run_level(&send, &clips, c, warmup, measured, seed);
                failures_outside += window.failures_outside;
                let row = window_row(&name, round, c, &mut window, args.level_s, ready_s, sla);
                eprintln!(
                    "[{name} round {round}/{} c={c}] {} answered in {:.1} s: {:.1} req/s, \
                     {:.1} audio-s/s, mean {:.0} ms, p50 {:.0} ms, p99 {:.0} ms, {} failed, SLA {}",
                    args.rounds,
                    row.requests,
                    args.level_s,
                    row.req_per_s,
                    row.audio_s_per_s,
                    row.mean_ms,
                    row.p50_ms,
                    row.p99_ms,
                    row.failures,
                    if row.sla_ok { "ok" } else { "missed" }
                );
                writeln!(csv, "{}", row.to_csv())?;
                csv.flush()?;
                for ms in &window.latencies_ms {
                    writeln!(latencies_csv, "{name},{round},{c},{ms:.3}")?;
                }
                latencies_csv.flush()?;
                latencies
                    .entry((name.clone(), c))
                    .or_default()
                    .extend_from_slice(&window.latencies_ms);
                rows.push(row);
            }
        }
        if let Some(fleet) = fleet {
            drop(fleet);
            eprintln!("[{name}] stopped");
            std::thread::sleep(Duration::from_secs_f64(args.settle_s.max(0.0)));
        }
    }

    let levels = sla::aggregate(&rows, Some(&latencies), sla);
    for line in best_lines(&levels, sla) {
        println!("{line}");
    }
    let summary = serde_json::to_string(&sla::summary(&levels))?;
    println!("{summary}");
    let summary_path = summary_path(&args.out_csv);
    std::fs::write(&summary_path, format!("{summary}\n"))
        .with_context(|| format!("writing {}", summary_path.display()))?;
    eprintln!(
        "sweep done in {:.0} s: {}, {}, {}",
        sweep_started.elapsed().as_secs_f64(),
        args.out_csv.display(),
        latencies_path.display(),
        summary_path.display()
    );
    let failed: u64 = rows.iter().map(|r| r.failures).sum::<u64>() + failures_outside;
    if failed > 0 {
        bail!("{failed} requests failed ({failures_outside} of them outside the measured windows)");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let base = [
            "sla_sweep",
            "--model",
            "/m.nemo",
            "--clips",
            "a.wav",
            "--worker-binary",
            "/w",
        ];
        Args::try_parse_from(base.iter().chain(extra)).unwrap()
    }

    #[test]
    fn layouts_parse_and_print() {
        for (s, l) in [
            ("single", Layout::Single),
            ("timeslice4", Layout::Timeslice(4)),
            ("mps8", Layout::Mps(8)),
            ("cpu2", Layout::Cpu(2)),
        ] {
            assert_eq!(s.parse::<Layout>().unwrap(), l);
            assert_eq!(l.to_string(), s);
        }
        for bad in ["mps0", "mps", "timeslice-1", "double", "cpux"] {
            assert!(bad.parse::<Layout>().is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_are_the_seed_sweep() {
        let a = args(&["--gpus", "0"]);
        assert_eq!(
            a.layouts,
            vec![
                Layout::Single,
                Layout::Timeslice(4),
                Layout::Mps(2),
                Layout::Mps(4),
                Layout::Mps(8)
            ]
        );
        assert_eq!(
            a.concurrency,
            vec![1, 2, 4, 8, 16, 32, 64, 100, 128, 160, 192, 256]
        );
        assert_eq!((a.rounds, a.level_s, a.warmup_s), (3, 4.0, 1.0));
        assert_eq!((a.sla_mean_ms, a.sla_p99_ms), (650.0, 1000.0));
        assert_eq!(a.engine, EngineKind::Cuda);
    }

    #[test]
    fn layouts_set_instances_mps_and_runtime_dir() {
        let a = args(&[
            "--gpus",
            "0",
            "--runtime-dir",
            "/run/s",
            "--mps-thread-percentage",
            "50",
        ]);
        let single = layout_config(&a, Layout::Single).unwrap();
        assert_eq!(single.groups[0].instances, 1);
        assert!(single.groups[0].mps.is_none());
        assert_eq!(single.runtime_dir, PathBuf::from("/run/s/single"));
        let ts = layout_config(&a, Layout::Timeslice(4)).unwrap();
        assert_eq!(ts.groups[0].instances, 4);
        assert!(ts.groups[0].mps.is_none());
        let mps = layout_config(&a, Layout::Mps(8)).unwrap();
        assert_eq!(mps.groups[0].instances, 8);
        let m = mps.groups[0].mps.as_ref().unwrap();
        assert_eq!(
            m.thread_percentage(8),
            12,
            "100/8, not --mps-thread-percentage"
        );
        assert_eq!(mps.runtime_dir, PathBuf::from("/run/s/mps8"));
        assert_eq!(mps.engine, EngineKind::Cuda);
        assert!(layout_config(&a, Layout::Cpu(2)).is_err());

        let cpu = args(&[
            "--engine",
            "cpu",
            "--cpu-instances",
            "1",
            "--runtime-dir",
            "/r",
        ]);
        let c = layout_config(&cpu, Layout::Cpu(3)).unwrap();
        assert_eq!((c.groups[0].instances, c.groups[0].gpu), (3, None));
        assert!(layout_config(&cpu, Layout::Mps(2)).is_err());
    }

    #[test]
    fn rng_is_seeded_and_uniform_enough() {
        let draws = |seed| {
            let mut r = Rng::new(seed);
            (0..20).map(|_| r.below(7)).collect::<Vec<_>>()
        };
        assert_eq!(draws(3), draws(3));
        assert_ne!(draws(3), draws(4));
        let mut r = Rng::new(thread_seed(1, [0, 1, 64, 5]));
        let mut counts = [0usize; 4];
        for _ in 0..40_000 {
            counts[r.below(4)] += 1;
        }
        assert!(
            counts.iter().all(|&n| (9_000..11_000).contains(&n)),
            "{counts:?}"
        );
        assert_ne!(thread_seed(1, [0, 1, 2, 3]), thread_seed(1, [0, 1, 2, 4]));
    }

    #[test]
    fn window_rows_count_rates_and_the_sla() {
        let sla = Sla {
            mean_ms: 650.0,
            p99_ms: 1000.0,
        };
        let mut w = Window {
            latencies_ms: vec![300.0, 100.0, 200.0, 400.0],
            audio_s: 20.0,
            failures: 0,
            failures_outside: 0,
        };
        let row = window_row("mps4", 2, 8, &mut w, 4.0, 30.0, sla);
        assert_eq!(
            (row.requests, row.req_per_s, row.audio_s_per_s),
            (4, 1.0, 5.0)
        );
        assert_eq!((row.mean_ms, row.p50_ms, row.p99_ms), (250.0, 200.0, 400.0));
        assert!(row.sla_ok);
        w.failures = 1;
        assert!(!window_row("mps4", 2, 8, &mut w, 4.0, 30.0, sla).sla_ok);
        let mut empty = Window::default();
        let row = window_row("mps4", 1, 1, &mut empty, 4.0, 30.0, sla);
        assert_eq!((row.requests, row.sla_ok), (0, false));
        assert_eq!(
            summary_path(Path::new("/tmp/s.csv")),
            PathBuf::from("/tmp/s.csv.summary.json")
        );
    }
}

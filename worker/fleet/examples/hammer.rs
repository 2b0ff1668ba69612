//! Load and fault drill for a fleet, for the GPU machine (docs/operations.md):
//!
//! 1. golden: every clip transcribed alone by a single worker on the first GPU without MPS;
//! 2. the fleet under test (e.g. 4 workers at 25 % under MPS) is started and each worker's
//!    handshake (device, SMs, MPS percentage) printed;
//! 3. `--concurrency` threads send clips for `--duration-s`, checking every answer against the
//!    golden one; with `--diar-model`, `--diar-concurrency` more threads send the clips to the
//!    diarization pool the same way (golden: one diarization worker without MPS); optionally
//!    one worker of `--kill-group` gets SIGKILL at `--kill-after-s`;
//! 4. one JSON summary line: requests, mismatches, errors, audio seconds per second, restarts
//!    by cause, worker states; then the fleet stops (and the MPS daemons it started).
//!
//! Exits non-zero if any answer differed from the golden one or failed.
//!
//! ```text
//! hammer --engine cuda --model M.nemo --clips a.wav,b.wav --gpus 0 --instances-per-gpu 4 \
//!        --worker-binary ./worker --duration-s 600
//! ```

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use model_core::speakers::SpeakerSegment;
use model_core::transcript::Hypothesis;
use worker_fleet::{Fleet, FleetOptions, RestartCause};
use worker_protocol::EngineKind;

#[derive(Debug, Parser)]
struct Args {
    /// `worker serve --engine` of every worker.
    #[arg(long, default_value = "cuda", value_enum)]
    engine: EngineKind,
    #[arg(long)]
    model: PathBuf,
    /// 16 kHz mono 16-bit WAV files, sent round-robin.
    #[arg(long, value_delimiter = ',', required = true)]
    clips: Vec<PathBuf>,
    #[arg(long, default_value_t = 60)]
    duration_s: u64,
    /// Requests in flight at once (one thread each).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// SIGKILL one worker of `--kill-group` this many seconds into the run.
    #[arg(long)]
    kill_after_s: Option<u64>,
    #[arg(long, default_value = "gpu0")]
    kill_group: String,
    /// Compare against this many seconds of warm-up answers from the fleet under test instead
    /// of a single-process golden run (for CPU smoke runs).
    #[arg(long)]
    skip_golden: bool,
    /// A Sortformer `.nemo`: the fleet also runs its diarization pool
    /// (`--diar-workers-per-gpu`, `--diar-mps-percentage`, `--diar-engine`).
    #[arg(long)]
    diar_model: Option<PathBuf>,
    /// Diarization requests in flight at once (one thread each), beside `--concurrency`.
    #[arg(long, default_value_t = 0)]
    diar_concurrency: usize,
    #[command(flatten)]
    fleet: FleetOptions,
}

/// Answers, mismatches and failures of one kind of request.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    mismatched: AtomicU64,
    failed: AtomicU64,
    audio_ms: AtomicU64,
}

impl Tally {
    fn record<T: PartialEq, E: std::fmt::Display>(
        &self,
        what: &str,
        clip: usize,
        seconds: f64,
        answer: Result<T, E>,
        golden: &T,
    ) {
        match answer {
            Ok(answer) if answer == *golden => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                self.audio_ms
                    .fetch_add((seconds * 1e3) as u64, Ordering::Relaxed);
            }
            Ok(_) => {
                self.mismatched.fetch_add(1, Ordering::Relaxed);
                eprintln!("MISMATCH {what} clip {clip}");
            }
            Err(error) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                eprintln!("FAILED {what} clip {clip}: {error}");
            }
        }
    }

    fn counts(&self) -> (u64, u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.mismatched.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

fn read_wav(path: &PathBuf) -> Result<Vec<f32>> {
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

fn answer_each(fleet: &Fleet, clips: &[Vec<f32>]) -> Result<Vec<Hypothesis>> {
    clips
        .iter()
        .map(|clip| {
            let mut answers = fleet.transcribe(&[clip.as_slice()]);
            Ok(answers.remove(0)?.hypothesis)
        })
        .collect()
}

fn diarize_each(fleet: &Fleet, clips: &[Vec<f32>]) -> Result<Vec<Vec<SpeakerSegment>>> {
    clips
        .iter()
        .map(|clip| Ok(fleet.diarize(clip.clone().into())?.segments))
        .collect()
}

fn start(options: &FleetOptions, args: &Args, label: &str) -> Result<Fleet> {
    let config =
        options.to_config_with_diarization(args.engine, &args.model, args.diar_model.as_deref())?;
    let started = Instant::now();
    let fleet = Fleet::start(config)?;
    fleet
        .wait_all_ready(Duration::from_secs(options.startup_timeout_s))
        .with_context(|| format!("{label}: waiting for every worker"))?;
    println!(
        "{}",
        serde_json::json!({
            "event": "fleet_ready",
            "fleet": label,
            "seconds": started.elapsed().as_secs_f64(),
            "workers": fleet.status(),
        })
    );
    Ok(fleet)
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let clips: Vec<Vec<f32>> = args.clips.iter().map(read_wav).collect::<Result<_>>()?;
    let clip_seconds: Vec<f64> = clips.iter().map(|c| c.len() as f64 / 16_000.0).collect();

    let golden = if args.skip_golden {
        None
    } else {
        let mut single = args.fleet.clone();
        single.instances_per_gpu = Some(1);
        single.no_mps = true;
        single.gpus.truncate(1);
        let base = single
            .runtime_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("parakeet-fleet"));
        single.runtime_dir = Some(base.join("golden"));
        single.diar_workers_per_gpu = 1;
        let fleet = start(&single, &args, "golden (1 worker each, no MPS)")?;
        let answers = answer_each(&fleet, &clips)?;
        let diarized = match &args.diar_model {
            Some(_) => diarize_each(&fleet, &clips)?,
            None => Vec::new(),
        };
        fleet.shutdown();
        Some((answers, diarized))
    };

    let fleet = Arc::new(start(&args.fleet, &args, "under test")?);
    let (golden, golden_diar) = match golden {
        Some(g) => g,
        None => (
            answer_each(&fleet, &clips)?,
            match &args.diar_model {
                Some(_) => diarize_each(&fleet, &clips)?,
                None => Vec::new(),
            },
        ),
    };
    let golden = Arc::new(golden);
    let golden_diar = Arc::new(golden_diar);
    let clips = Arc::new(clips);
    let tally = Arc::new(Tally::default());
    let diar_tally = Arc::new(Tally::default());
    let diar_threads = if args.diar_model.is_some() {
        args.diar_concurrency
    } else {
        0
    };
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration_s);

    let mut threads = Vec::new();
    for t in 0..args.concurrency + diar_threads {
        let diarizing = t >= args.concurrency;
        let (fleet, clips, golden, golden_diar) = (
            fleet.clone(),
            clips.clone(),
            golden.clone(),
            golden_diar.clone(),
        );
        let tally = if diarizing {
            diar_tally.clone()
        } else {
            tally.clone()
        };
        let seconds = clip_seconds.clone();
        threads.push(std::thread::spawn(move || {
            let mut i = t;
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let c = i % clips.len();
                i += 1;
                let sent = Instant::now();
                if diarizing {
                    let answer = fleet.diarize(clips[c].clone().into()).map(|r| r.segments);
                    tally.record("diarize", c, seconds[c], answer, &golden_diar[c]);
                } else {
                    let answer = fleet
                        .transcribe(&[clips[c].as_slice()])
                        .remove(0)
                        .map(|r| r.hypothesis);
                    latencies.push(sent.elapsed().as_secs_f64());
                    tally.record("transcribe", c, seconds[c], answer, &golden[c]);
                }
            }
            latencies
        }));
    }

    let killer = args.kill_after_s.map(|after| {
        let (fleet, stop, group) = (fleet.clone(), stop.clone(), args.kill_group.clone());
        std::thread::spawn(move || {
            let at = started + Duration::from_secs(after);
            while Instant::now() < at && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let victim = fleet
                .status()
                .into_iter()
                .find(|w| w.group == group && w.ready && w.pid.is_some());
            if let Some(pid) = victim.as_ref().and_then(|w| w.pid) {
                let killed = rustix::process::Pid::from_raw(pid as i32)
                    .map(|p| rustix::process::kill_process(p, rustix::process::Signal::KILL));
                println!(
                    "{}",
                    serde_json::json!({
                        "event": "sigkill",
                        "group": group,
                        "pid": pid,
                        "at_s": started.elapsed().as_secs_f64(),
                        "sent": matches!(killed, Some(Ok(()))),
                    })
                );
            }
        })
    });

    // Progress every 10 s: answers so far and each worker's phase.
    let mut last = 0;
    while Instant::now() < deadline {
        std::thread::sleep(
            Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now())),
        );
        let elapsed = started.elapsed().as_secs();
        if elapsed >= last + 10 {
            last = elapsed;
            let phases: Vec<String> = fleet
                .status()
                .iter()
                .map(|w| format!("{}/{}:{:?}/r{}", w.group, w.slot, w.phase, w.restarts))
                .collect();
            println!(
                "{}",
                serde_json::json!({
                    "event": "progress",
                    "at_s": elapsed,
                    "ok": tally.counts().0,
                    "mismatched": tally.counts().1,
                    "failed": tally.counts().2,
                    "diarized": diar_tally.counts(),
                    "workers": phases,
                })
            );
        }
    }
    let mut latencies: Vec<f64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_default())
        .collect();
    latencies.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |s| s * 1e3)
    };
    stop.store(true, Ordering::Relaxed);
    if let Some(killer) = killer {
        let _ = killer.join();
    }
    let wall = started.elapsed().as_secs_f64();
    let restarts: serde_json::Map<String, serde_json::Value> = RestartCause::ALL
        .iter()
        .map(|c| (c.label().to_owned(), fleet.restarts(*c).into()))
        .collect();
    let (ok, mismatched, failed) = tally.counts();
    let (diar_ok, diar_mismatched, diar_failed) = diar_tally.counts();
    println!(
        "{}",
        serde_json::json!({
            "event": "summary",
            "seconds": wall,
            "ok": ok,
            "mismatched": mismatched,
            "failed": failed,
            "audio_seconds_per_second": tally.audio_ms.load(Ordering::Relaxed) as f64 / 1e3 / wall,
            "diarization": {
                "ok": diar_ok,
                "mismatched": diar_mismatched,
                "failed": diar_failed,
                "audio_seconds_per_second":
                    diar_tally.audio_ms.load(Ordering::Relaxed) as f64 / 1e3 / wall,
            },
            "latency_ms": {
                "p50": quantile(0.5), "p90": quantile(0.9), "p99": quantile(0.99),
                "max": latencies.last().map_or(0.0, |s| s * 1e3),
            },
            "restarts": restarts,
            "workers": fleet.status(),
        })
    );
    fleet.shutdown();
    println!("{}", serde_json::json!({"event": "stopped"}));
    if mismatched + diar_mismatched > 0 || failed + diar_failed > 0 {
        bail!(
            "{mismatched} transcriptions and {diar_mismatched} diarizations differed from the \
             golden ones, {failed} and {diar_failed} failed"
        );
    }
    Ok(())
}

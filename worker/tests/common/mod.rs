//! Fixture clips, reference hypotheses and worker processes for the integration tests.

#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use model_core::transcript::Hypothesis;
use models::ParakeetModel;
use worker_protocol::{read_frame, write_frame, ClientMessage, WorkerMessage, PROTOCOL_VERSION};

/// Polls `cond` every 10 ms until it holds (true) or `timeout` passes (false).
pub fn wait_until(timeout: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures")
}

pub fn model_path() -> PathBuf {
    fixtures().join("tdt-real-options/model.nemo")
}

pub fn worker_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_worker"))
}

/// The tiny random-weight Sortformer fixture and its three-speaker clip.
pub fn sortformer_path() -> PathBuf {
    fixtures().join("sortformer-tiny/model.nemo")
}

pub fn three_speakers() -> Result<Vec<f32>> {
    read_wav(&fixtures().join("sortformer-tiny/three_speakers.wav"))
}

pub fn read_wav(path: &Path) -> Result<Vec<f32>> {
    let mut reader = hound::WavReader::open(path).with_context(|| path.display().to_string())?;
    reader
        .samples::<i16>()
        .map(|s| Ok(s? as f32 / 32768.0))
        .collect()
}

/// Every fixture clip, by name, sorted.
pub fn clips() -> Result<Vec<(String, Vec<f32>)>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(fixtures().join("clips"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.retain(|p| p.extension().is_some_and(|e| e == "wav"));
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let name = p
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            Ok((name, read_wav(p)?))
        })
        .collect()
}

/// Each clip decoded alone by the in-process CPU model: what every worker answer must equal.
pub fn reference(clips: &[(String, Vec<f32>)]) -> Result<(ParakeetModel, Vec<Hypothesis>)> {
    let model = ParakeetModel::load(&model_path())?;
    let hyps = clips
        .iter()
        .map(|(_, pcm)| Ok(model.transcribe_batch(&[pcm])?.remove(0)))
        .collect::<Result<_>>()?;
    Ok((model, hyps))
}

/// A `worker serve` child, killed on drop.
pub struct WorkerProcess {
    pub child: Child,
    pub socket: PathBuf,
}

impl WorkerProcess {
    /// The CPU engine on the fixture model.
    pub fn start(dir: &Path, extra: &[&str]) -> Result<Self> {
        let model = model_path().display().to_string();
        let mut args = vec!["--model", model.as_str()];
        args.extend_from_slice(extra);
        Self::start_with(dir, &args)
    }

    /// `worker serve --socket <dir>/worker.sock <args>`.
    pub fn start_with(dir: &Path, args: &[&str]) -> Result<Self> {
        let socket = dir.join("worker.sock");
        let child = Command::new(worker_binary())
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .stdin(Stdio::null())
            .spawn()?;
        let mut me = Self { child, socket };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !me.socket.exists() {
            if let Some(status) = me.child.try_wait()? {
                bail!("worker exited before ready: {status}");
            }
            if Instant::now() > deadline {
                bail!("worker not ready in 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(me)
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// A connection after a successful handshake.
    pub fn connect(&self) -> Result<UnixStream> {
        Ok(self.handshake()?.0)
    }

    /// A connection and the worker's handshake.
    pub fn handshake(&self) -> Result<(UnixStream, worker_protocol::WorkerInfo)> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        write_frame(
            &mut stream,
            &ClientMessage::Hello {
                version: PROTOCOL_VERSION,
                client: "test".into(),
            },
        )?;
        match read_frame::<WorkerMessage>(&mut stream)? {
            WorkerMessage::Hello { worker, .. } => Ok((stream, worker)),
            other => bail!("expected Hello, got {other:?}"),
        }
    }

    pub fn send_raw(&self, bytes: &[u8]) -> Result<UnixStream> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.write_all(bytes)?;
        Ok(stream)
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

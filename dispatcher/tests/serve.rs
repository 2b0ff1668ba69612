//! `dispatcher serve`, the OpenAI-compatible transcription API, as a client sees it: the
//! official `openai` Python package (`serve_client.py`) transcribes a fixture clip in every
//! response format and gets byte for byte what `dispatcher transcribe` prints, and gets typed
//! errors (401, 400, 413, 415); a full pending queue answers 429 with `Retry-After`; SIGTERM
//! stops new connections while an accepted request still finishes; a fleet with no ready
//! worker answers 503 with `Retry-After`; `/health` and `/metrics` say so.
//!
//! Without python3's `openai` package the client test skips loudly, unless
//! `REQUIRE_API_CLIENTS` is set (CI installs it).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures")
}

fn model() -> PathBuf {
    fixtures().join("tdt-real-options/model.nemo")
}

fn clip() -> PathBuf {
    fixtures().join("clips/espeak_us.wav")
}

fn audio_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("audio/tests/data")
        .join(name)
}

fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// A `dispatcher serve` process, killed when dropped; its log in `log`.
struct Server {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Server {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Result<Self> {
        let addr = free_addr();
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .args(["serve", "--listen", &addr.to_string()])
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting dispatcher serve")?;
        Ok(Self { child, addr, log })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `/health` until it answers `status`.
    fn wait_health(&mut self, status: u16, timeout: Duration) -> Result<Response> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(r) = request(self.addr, &get("/health")) {
                if r.status == status {
                    return Ok(r);
                }
            }
            if let Some(exit) = self.child.try_wait()? {
                anyhow::bail!(
                    "server exited {exit} before /health was {status}:\n{}",
                    self.log()
                );
            }
            ensure!(
                Instant::now() < deadline,
                "/health never answered {status}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn sigterm(&self) -> Result<()> {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?
            .success();
        ensure!(ok, "kill -TERM failed");
        Ok(())
    }

    /// Waits for the process to exit by itself.
    fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            ensure!(
                Instant::now() < deadline,
                "server did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    head: String,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes()
}

fn parse(raw: &[u8]) -> Result<Response> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").context("no header end")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .context("no status")?
        .parse()?;
    Ok(Response {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    })
}

/// One request on its own connection (`Connection: close`), read to the end.
fn request(addr: SocketAddr, bytes: &[u8]) -> Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.write_all(bytes)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse(&raw)
}

const BOUNDARY: &str = "----serve-test-boundary";

/// A transcription request: its headers, and its body as the part before the file's bytes
/// end and the rest (so a test can hold the request open mid-body).
fn transcription_request(file: &[u8], key: Option<&str>) -> (Vec<u8>, Vec<u8>) {
    form_request(file, "clip.wav", &[("model", "whisper-1")], key)
}

/// [`transcription_request`] with any text fields and the upload's file name.
fn form_request(
    file: &[u8],
    file_name: &str,
    fields: &[(&str, &str)],
    key: Option<&str>,
) -> (Vec<u8>, Vec<u8>) {
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend(
            format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
                .bytes(),
        );
    }
    body.extend(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{file_name}\"\r\nContent-Type: audio/wav\r\n\r\n"
        )
        .bytes(),
    );
    body.extend_from_slice(file);
    body.extend(format!("\r\n--{BOUNDARY}--\r\n").bytes());
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let mut head = format!(
        "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    let split = body.len() - 100;
    head.extend_from_slice(&body[..split]);
    (head, body[split..].to_vec())
}

fn transcribe_reference(format: &str) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .args([
            "transcribe",
            "--language",
            "english",
            "--format",
            format,
            "--model",
        ])
        .arg(model())
        .arg(clip())
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

#[test]
fn the_openai_package_gets_what_transcribe_prints_and_typed_errors() -> Result<()> {
    if !common::tools::present(
        "the_openai_package_gets_what_transcribe_prints_and_typed_errors",
        "REQUIRE_API_CLIENTS",
        &[("python3 with openai", &["python3", "-c", "import openai"])],
        "pip install -r scripts/ci-requirements.txt",
    ) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "# test key\nsk-test-key\n")?;
    // long.wav is 793 KB: over this limit, while the clip (112 KB) is under it.
    let mut server = Server::start(
        dir.path(),
        "client",
        &[
            "--model",
            model().to_str().context("utf-8 path")?,
            "--api-keys-file",
            keys.to_str().context("utf-8 path")?,
            "--max-input-bytes",
            "400000",
        ],
    )?;
    let health = server.wait_health(200, Duration::from_secs(60))?;
    ensure!(
        health.body.contains("\"state\": \"ready\""),
        "{}",
        health.body
    );

    let out = dir.path().join("out");
    std::fs::create_dir(&out)?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve_client.py");
    let run = Command::new("python3")
        .arg(script)
        .arg(format!("http://{}", server.addr))
        .arg("sk-test-key")
        .arg(clip())
        .arg(&out)
        .arg("--too-large")
        .arg(fixtures().join("clips/long.wav"))
        .arg("--not-audio")
        .arg(audio_data("random.bin"))
        .output()?;
    ensure!(
        run.status.success(),
        "serve_client.py: {}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
        server.log()
    );
    let report: serde_json::Value = serde_json::from_slice(&run.stdout)?;

    for format in ["json", "text", "srt", "vtt", "verbose_json"] {
        let got = std::fs::read_to_string(out.join(format))?;
        let want = transcribe_reference(format)?;
        ensure!(
            got == want,
            "{format}: the API gave\n{got}\n`dispatcher transcribe` prints\n{want}"
        );
        let seen = &report["formats"][format];
        ensure!(
            seen["status"] == 200 && seen["text_chars"].as_u64() > Some(0),
            "{format}: {seen}"
        );
    }
    ensure!(report["formats"]["json"]["parsed_type"] == "Transcription");
    ensure!(report["formats"]["verbose_json"]["parsed_type"] == "TranscriptionVerbose");
    ensure!(report["formats"]["srt"]["parsed_type"] == "str");
    ensure!(
        report["models"] == serde_json::json!(["model", "whisper-1"]),
        "{}",
        report["models"]
    );

    let errors = &report["errors"];
    for (case, exception, status, code) in [
        ("wrong_key", "AuthenticationError", 401, "invalid_api_key"),
        ("unknown_model", "BadRequestError", 400, "model_not_found"),
        (
            "bad_format",
            "BadRequestError",
            400,
            "invalid_response_format",
        ),
        (
            "unsupported_language",
            "BadRequestError",
            400,
            "unsupported_language",
        ),
        (
            "rttm_without_diarize",
            "BadRequestError",
            400,
            "rttm_needs_diarize",
        ),
        ("too_large", "APIStatusError", 413, "too_large"),
        ("not_audio", "APIStatusError", 415, "unsupported_format"),
    ] {
        let e = &errors[case];
        ensure!(
            e["exception"] == exception && e["status"] == status && e["code"] == code,
            "{case}: {e}"
        );
    }

    // A request without a key at all, outside the client.
    let (head, tail) = transcription_request(&std::fs::read(clip())?, None);
    let r = request(server.addr, &[head, tail].concat())?;
    ensure!(
        r.status == 401 && r.body.contains("missing_api_key"),
        "{r:?}"
    );

    let metrics = request(server.addr, &get("/metrics"))?.body;
    for line in [
        "dispatcher_api_requests_total{status=\"200\"} 5",
        "dispatcher_api_requests_total{status=\"401\"} 2",
        "dispatcher_api_requests_total{status=\"413\"} 1",
        "dispatcher_api_requests_total{status=\"415\"} 1",
        "dispatcher_api_request_seconds_count 13",
        "dispatcher_api_request_seconds_recent{quantile=\"0.99\"}",
    ] {
        ensure!(metrics.contains(line), "/metrics lacks {line}:\n{metrics}");
    }
    Ok(())
}

#[test]
fn a_full_queue_answers_429_and_sigterm_lets_the_accepted_request_finish() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut server = Server::start(
        dir.path(),
        "drain",
        &[
            "--model",
            model().to_str().context("utf-8 path")?,
            "--max-pending-requests",
            "1",
            "--drain-grace-s",
            "30",
        ],
    )?;
    server.wait_health(200, Duration::from_secs(60))?;
    let audio = std::fs::read(clip())?;

    // The first request's body stops 100 bytes short: it holds the only pending slot.
    let (head, tail) = transcription_request(&audio, None);
    let mut held = TcpStream::connect(server.addr)?;
    held.write_all(&head)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let health = request(server.addr, &get("/health"))?;
        if health.body.contains("\"pending_requests\": 1") {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the held request never became pending: {}",
            health.body
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let (head2, tail2) = transcription_request(&audio, None);
    let refused = request(server.addr, &[head2, tail2].concat())?;
    ensure!(refused.status == 429, "{refused:?}");
    ensure!(refused.header("retry-after") == Some("1"), "{refused:?}");
    ensure!(
        refused.body.contains("\"type\":\"rate_limit_error\""),
        "{refused:?}"
    );

    // SIGTERM: no new connections, the accepted request still gets its answer.
    server.sigterm()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&server.addr, Duration::from_millis(200)).is_ok() {
        ensure!(
            Instant::now() < deadline,
            "still accepting connections after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    held.write_all(&tail)?;
    held.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut raw = Vec::new();
    held.read_to_end(&mut raw)?;
    let answer = parse(&raw)?;
    ensure!(answer.status == 200, "{answer:?}");
    ensure!(
        answer.body == transcribe_reference("json")?,
        "{}",
        answer.body
    );
    let exit = server.wait_exit(Duration::from_secs(20))?;
    ensure!(exit.success(), "exit {exit}:\n{}", server.log());
    ensure!(
        server.log().contains("every accepted request answered"),
        "{}",
        server.log()
    );
    Ok(())
}

#[test]
fn no_ready_worker_means_503_with_retry_after() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // A worker that never says it is ready (the fleet keeps waiting) and ends with its parent.
    let worker = dir.path().join("never-ready-worker");
    std::fs::write(
        &worker,
        "#!/bin/sh\nwhile kill -0 $PPID 2>/dev/null; do sleep 0.2; done\n",
    )?;
    Command::new("chmod").arg("+x").arg(&worker).status()?;
    let mut server = Server::start(
        dir.path(),
        "unready",
        &[
            "--model",
            model().to_str().context("utf-8 path")?,
            "--cpu-instances",
            "1",
            "--worker-binary",
            worker.to_str().context("utf-8 path")?,
            "--fleet-ready-timeout-s",
            "120",
        ],
    )?;
    let health = server.wait_health(503, Duration::from_secs(30))?;
    ensure!(
        health.body.contains("\"state\": \"loading\""),
        "{}",
        health.body
    );
    let (head, tail) = transcription_request(&std::fs::read(clip())?, None);
    let r = request(server.addr, &[head, tail].concat())?;
    ensure!(r.status == 503, "{r:?}");
    ensure!(r.header("retry-after") == Some("5"), "{r:?}");
    ensure!(r.body.contains("the model is loading"), "{r:?}");
    let models = request(server.addr, &get("/v1/models"))?;
    ensure!(
        models.status == 200 && models.body.contains("whisper-1"),
        "{models:?}"
    );
    // Stopped while the fleet is still starting: it exits at once, cleanly.
    server.sigterm()?;
    let exit = server.wait_exit(Duration::from_secs(20))?;
    ensure!(exit.success(), "exit {exit}:\n{}", server.log());
    Ok(())
}

/// With `--spool`, `--store` and `--input-dir`, the server also works through that job queue
/// on the same engine: every fixture clip gets its result while the API answers.
#[test]
fn serve_also_consumes_a_local_job_queue() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let inputs = fixtures().join("clips");
    let store = dir.path().join("store");
    let mut server = Server::start(
        dir.path(),
        "jobs",
        &[
            "--model",
            model().to_str().context("utf-8 path")?,
            "--spool",
            dir.path().join("spool").to_str().context("utf-8 path")?,
            "--store",
            store.to_str().context("utf-8 path")?,
            "--input-dir",
            inputs.to_str().context("utf-8 path")?,
        ],
    )?;
    server.wait_health(200, Duration::from_secs(60))?;
    let (head, tail) = transcription_request(&std::fs::read(clip())?, None);
    let answer = request(server.addr, &[head, tail].concat())?;
    ensure!(answer.status == 200, "{answer:?}");
    let clips = std::fs::read_dir(&inputs)?.count();
    let deadline = Instant::now() + Duration::from_secs(120);
    let manifests = || -> usize {
        walk(&store.join("results"))
            .iter()
            .filter(|p| p.ends_with("manifest.json"))
            .count()
    };
    while manifests() < clips {
        ensure!(
            Instant::now() < deadline,
            "{} of {clips} results:\n{}",
            manifests(),
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    server.sigterm()?;
    let exit = server.wait_exit(Duration::from_secs(30))?;
    ensure!(exit.success(), "exit {exit}:\n{}", server.log());
    ensure!(server
        .log()
        .contains("consuming the spool's jobs beside the API"));
    Ok(())
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let path = e.path();
            if path.is_dir() {
                walk(&path)
            } else {
                vec![path]
            }
        })
        .collect()
}

/// The diarization extension: `diarize=true` gives `rttm`, and speaker labels in
/// `verbose_json`, exactly as `dispatcher transcribe --diarize` prints them.
#[test]
fn diarize_gives_what_transcribe_diarize_prints() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let diar = fixtures().join("sortformer-tiny/model.nemo");
    let wav = fixtures().join("sortformer-tiny/three_speakers.wav");
    let mut server = Server::start(
        dir.path(),
        "diarize",
        &[
            "--model",
            model().to_str().context("utf-8 path")?,
            "--diar-model",
            diar.to_str().context("utf-8 path")?,
        ],
    )?;
    server.wait_health(200, Duration::from_secs(60))?;
    let audio = std::fs::read(&wav)?;
    for (format, granularities) in [("rttm", None), ("verbose_json", Some(["word", "segment"]))] {
        let mut fields = vec![
            ("model", "whisper-1"),
            ("diarize", "true"),
            ("response_format", format),
        ];
        for g in granularities.into_iter().flatten() {
            fields.push(("timestamp_granularities[]", g));
        }
        let (head, tail) = form_request(&audio, "three_speakers.wav", &fields, None);
        let answer = request(server.addr, &[head, tail].concat())?;
        ensure!(answer.status == 200, "{format}: {answer:?}");
        let out = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .args([
                "transcribe",
                "--diarize",
                "--format",
                format,
                "--diar-model",
            ])
            .arg(&diar)
            .arg("--model")
            .arg(model())
            .arg(&wav)
            .output()?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = String::from_utf8(out.stdout)?;
        ensure!(
            answer.body == want,
            "{format}: the API gave\n{}\ntranscribe prints\n{want}",
            answer.body
        );
        ensure!(want.contains("speaker"), "{format} names speakers: {want}");
    }
    Ok(())
}

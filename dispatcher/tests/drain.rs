//! Stopping without stranding messages: a receive in progress when the stop comes completes
//! and releases what it got at once; an interruption notice from the EC2 instance metadata
//! service (a fake IMDSv2 on 127.0.0.1) stops receiving, lets in-flight jobs finish within
//! the notice or releases them, and nothing is lost or written twice. Both backends.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use aws_sdk_sqs::primitives::{DateTime, DateTimeFormat};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, put};
use common::{clip, records, Backend, Slow};
use dispatcher::app::{self, MetricsRuntime};
use dispatcher::config::Settings;
use dispatcher::error::Result;
use dispatcher::job::JobMessage;
use dispatcher::lifecycle::interruption::{self, InstanceMetadata, Notice, RELEASE_MARGIN};
use dispatcher::lifecycle::{Consumer, RunSummary};
use dispatcher::queue::{Queue, Received};
use dispatcher::transcriber::Transcriber;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The backend's queue, with each non-empty receive answering `delay` late (SQS has handed
/// the messages out; its answer is still on the wire); every receive's start, every answered
/// receipt (with when it was answered) and every released receipt recorded.
struct LateAnswers {
    inner: Arc<dyn Queue>,
    delay: Duration,
    answered: Notify,
    starts: Mutex<Vec<Instant>>,
    delivered: AtomicU64,
    answers: Mutex<Vec<(Instant, String)>>,
    releases: Mutex<Vec<String>>,
}

impl LateAnswers {
    fn new(inner: Arc<dyn Queue>, delay: Duration) -> Self {
        Self {
            inner,
            delay,
            answered: Notify::new(),
            starts: Mutex::new(Vec::new()),
            delivered: AtomicU64::new(0),
            answers: Mutex::new(Vec::new()),
            releases: Mutex::new(Vec::new()),
        }
    }

    /// Released messages whose receive had answered before `at`.
    fn released_of_answers_before(&self, at: Instant) -> usize {
        let answers = self.answers.lock().expect("lock");
        self.releases
            .lock()
            .expect("lock")
            .iter()
            .filter(|r| answers.iter().any(|(t, a)| a == *r && *t < at))
            .count()
    }
}

#[async_trait]
impl Queue for LateAnswers {
    async fn receive(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Received>> {
        self.starts.lock().expect("lock").push(Instant::now());
        let messages = self.inner.receive(max_messages, wait, visibility).await?;
        if !messages.is_empty() {
            self.delivered
                .fetch_add(messages.len() as u64, Ordering::SeqCst);
            self.answered.notify_one();
            tokio::time::sleep(self.delay).await;
        }
        let now = Instant::now();
        self.answers
            .lock()
            .expect("lock")
            .extend(messages.iter().map(|m| (now, m.receipt.clone())));
        Ok(messages)
    }
    async fn extend(&self, receipt: &str, visibility: Duration) -> Result<()> {
        self.inner.extend(receipt, visibility).await
    }
    async fn delete_batch(&self, receipts: &[String]) -> Result<Vec<Result<()>>> {
        self.inner.delete_batch(receipts).await
    }
    async fn release(&self, receipt: &str) -> Result<()> {
        self.releases
            .lock()
            .expect("lock")
            .push(receipt.to_string());
        self.inner.release(receipt).await
    }
    async fn send_batch(&self, bodies: &[String]) -> Result<Vec<Result<()>>> {
        self.inner.send_batch(bodies).await
    }
    async fn pending(&self) -> Result<u64> {
        self.inner.pending().await
    }
}

async fn enqueue(backend: &Backend, jobs: usize) {
    let audio = clip("espeak_us.wav");
    for i in 0..jobs {
        let key = format!("drain/{i:02}.wav");
        backend.put_input(&key, &audio).await;
        let message = JobMessage::new(format!("drain-{i}"), &backend.input(&key));
        backend
            .send(&serde_json::to_string(&message).expect("json"))
            .await;
    }
}

fn consumer(
    backend: &Backend,
    queue: Arc<dyn Queue>,
    transcriber: Arc<dyn Transcriber>,
    settings: &Settings,
    metrics: &MetricsRuntime,
) -> Arc<Consumer> {
    let parts = app::ConsumerParts {
        queue,
        store: backend.store.clone(),
        transcriber,
        diarizer: None,
    };
    app::consumer(settings, parts, metrics, false).expect("consumer")
}

/// After a stop: every job done exactly once once a plain consumer has run to idle.
async fn finish_the_rest(backend: &Backend, jobs: usize) -> RunSummary {
    let settings = common::settings(backend, |_| {});
    let rest = common::run_until_idle(backend, common::engine(), &settings).await;
    let (manifests, failures) = records(backend).await;
    assert_eq!((manifests.len(), failures.len()), (jobs, 0), "{rest:?}");
    assert_eq!(backend.pending().await, 0);
    assert!(backend.dead_letters().await.is_empty());
    rest
}

async fn a_receive_in_progress_at_the_stop_releases_what_it_got(backend: Backend) {
    enqueue(&backend, 3).await;
    let queue = Arc::new(LateAnswers::new(
        backend.queue.clone(),
        Duration::from_secs(2),
    ));
    let settings = common::settings(&backend, |s| {
        s.receivers = Some(1);
        s.visibility_timeout_s = Some(60);
    });
    let metrics = MetricsRuntime::start(&settings, None)
        .await
        .expect("metrics");
    let consumer = consumer(
        &backend,
        queue.clone(),
        common::engine(),
        &settings,
        &metrics,
    );
    let stop = CancellationToken::new();
    let run = tokio::spawn(consumer.run(stop.clone()));
    tokio::time::timeout(Duration::from_secs(30), queue.answered.notified())
        .await
        .expect("a receive got the messages");
    // SIGTERM's effect, while the answer is still on its way.
    stop.cancel();
    let summary = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("stopped")
        .expect("run");
    metrics.shutdown().await;
    assert_eq!((summary.released, summary.done), (3, 0), "{summary:?}");
    // Visible again at once, not after the 60 s visibility timeout.
    let again = backend
        .queue
        .receive(10, Duration::from_secs(1), Duration::from_secs(60))
        .await
        .expect("receive");
    assert_eq!(again.len(), 3, "released messages are visible at once");
    for message in &again {
        backend
            .queue
            .release(&message.receipt)
            .await
            .expect("release");
    }
    finish_the_rest(&backend, 3).await;
}
both_backends!(a_receive_in_progress_at_the_stop_releases_what_it_got, 4);

/// What the fake instance metadata service answers.
#[derive(Default)]
struct Imds {
    spot_action: Option<String>,
    lifecycle_state: Option<&'static str>,
}

type Shared = Arc<Mutex<Imds>>;
const TOKEN: &str = "test-token";
const TTL_HEADER: &str = "x-aws-ec2-metadata-token-ttl-seconds";

/// IMDSv2 as EC2 serves it: a token from PUT, then GETs that must carry it (401 otherwise).
async fn serve_imds(state: Shared) -> String {
    async fn token(headers: HeaderMap) -> (StatusCode, HeaderMap, String) {
        let mut answer = HeaderMap::new();
        match headers.get(TTL_HEADER) {
            // EC2 echoes the token's lifetime.
            Some(ttl) => {
                answer.insert(TTL_HEADER, ttl.clone());
                (StatusCode::OK, answer, TOKEN.into())
            }
            None => (StatusCode::BAD_REQUEST, answer, "ttl header missing".into()),
        }
    }
    fn authorized(headers: &HeaderMap) -> bool {
        headers
            .get("x-aws-ec2-metadata-token")
            .is_some_and(|t| t == TOKEN)
    }
    async fn spot(State(state): State<Shared>, headers: HeaderMap) -> (StatusCode, String) {
        if !authorized(&headers) {
            return (StatusCode::UNAUTHORIZED, String::new());
        }
        match &state.lock().expect("lock").spot_action {
            Some(body) => (StatusCode::OK, body.clone()),
            None => (StatusCode::NOT_FOUND, String::new()),
        }
    }
    async fn lifecycle(State(state): State<Shared>, headers: HeaderMap) -> (StatusCode, String) {
        if !authorized(&headers) {
            return (StatusCode::UNAUTHORIZED, String::new());
        }
        match state.lock().expect("lock").lifecycle_state {
            Some(s) => (StatusCode::OK, s.into()),
            None => (StatusCode::NOT_FOUND, String::new()),
        }
    }
    let app = axum::Router::new()
        .route("/latest/api/token", put(token))
        .route("/latest/meta-data/spot/instance-action", get(spot))
        .route(
            "/latest/meta-data/autoscaling/target-lifecycle-state",
            get(lifecycle),
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

struct Interrupted {
    summary: RunSummary,
    notice: Option<Notice>,
    /// From the notice being served to the consumer's return.
    stopped_within: Duration,
    receives_after_notice: usize,
    /// Released messages whose receive had answered before the notice was served: jobs
    /// started before the notice and not finished.
    released_started: usize,
}

/// Runs a consumer with the watcher; once `started_jobs` are done and another is in flight,
/// the fake service starts answering with `serve`'s notice.
async fn interrupt(
    backend: &Backend,
    transcriber: Arc<dyn Transcriber>,
    settings: &Settings,
    started_jobs: u64,
    serve: impl FnOnce(&mut Imds),
) -> Interrupted {
    let state = Shared::default();
    state.lock().expect("lock").lifecycle_state = Some("InService");
    let url = serve_imds(state.clone()).await;
    let queue = Arc::new(LateAnswers::new(backend.queue.clone(), Duration::ZERO));
    let metrics = MetricsRuntime::start(settings, None)
        .await
        .expect("metrics");
    let consumer = consumer(backend, queue.clone(), transcriber, settings, &metrics);
    let stop = CancellationToken::new();
    let metadata = InstanceMetadata::new(&url).expect("metadata client");
    let watcher = tokio::spawn({
        let (consumer, stop) = (consumer.clone(), stop.clone());
        async move {
            let notice =
                interruption::watch(metadata, consumer, stop, Duration::from_millis(100)).await;
            (notice, Instant::now())
        }
    });
    let run = tokio::spawn(consumer.clone().run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(60);
    // `started_jobs` done and the next one in flight.
    while consumer.summary().done < started_jobs
        || queue.delivered.load(Ordering::SeqCst) <= consumer.summary().done
    {
        assert!(Instant::now() < deadline, "{:?}", consumer.summary());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let served = Instant::now();
    serve(&mut state.lock().expect("lock"));
    let summary = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("stopped within 60 s")
        .expect("run");
    let stopped_within = served.elapsed();
    let (notice, watcher_returned) = watcher.await.expect("watcher");
    metrics.shutdown().await;
    let receives_after_notice = queue
        .starts
        .lock()
        .expect("lock")
        .iter()
        .filter(|t| **t > watcher_returned)
        .count();
    let released_started = queue.released_of_answers_before(served);
    Interrupted {
        summary,
        notice,
        stopped_within,
        receives_after_notice,
        released_started,
    }
}

/// A Spot notice a few seconds (plus the release margin) ahead: the jobs in flight finish,
/// nothing more is received, and the consumer is done before the notice's time. (Six seconds:
/// with three, a 300 ms job's store calls on a loaded CI machine missed the window once.)
async fn a_spot_notice_drains_within_the_notice(backend: Backend) {
    let jobs = 10;
    enqueue(&backend, jobs).await;
    let settings = common::settings(&backend, |s| {
        s.receivers = Some(1);
        s.max_in_flight = Some(2);
        s.max_messages_per_receive = Some(1);
        s.drain_grace_s = Some(60);
    });
    let slow = Arc::new(Slow {
        inner: common::engine(),
        delay: Duration::from_millis(300),
    });
    let result = interrupt(&backend, slow, &settings, 2, |imds| {
        let at = SystemTime::now() + RELEASE_MARGIN + Duration::from_secs(6);
        let time = DateTime::from(at)
            .fmt(DateTimeFormat::DateTime)
            .expect("format time");
        imds.spot_action = Some(format!(r#"{{"action": "terminate", "time": "{time}"}}"#));
    })
    .await;
    assert!(
        matches!(&result.notice, Some(Notice::Spot { action, at: Some(_) }) if action == "terminate"),
        "{:?}",
        result.notice
    );
    assert_eq!(result.receives_after_notice, 0);
    // Seconds are whole in the notice: up to 6 s to finish, plus the poll and a little slack.
    assert!(
        result.stopped_within < Duration::from_secs(7),
        "{:?}",
        result.stopped_within
    );
    let summary = result.summary;
    // A receive in progress when the stop came may return its one message, released at once.
    assert_eq!(result.released_started, 0, "short jobs finish: {summary:?}");
    assert!(summary.released <= 1, "{summary:?}");
    assert!(
        summary.done >= 2 && summary.done < jobs as u64,
        "{summary:?}"
    );
    assert_eq!(backend.pending().await, jobs as u64 - summary.done);
    let rest = finish_the_rest(&backend, jobs).await;
    assert_eq!(rest.done + summary.done, jobs as u64, "each job done once");
}
both_backends!(a_spot_notice_drains_within_the_notice, 4);

/// The Auto Scaling group terminating the instance: receiving stops; a job that cannot finish
/// within the drain grace is released, then done once by the next consumer.
async fn a_scale_in_releases_what_cannot_finish(backend: Backend) {
    let jobs = 4;
    enqueue(&backend, jobs).await;
    let settings = common::settings(&backend, |s| {
        s.receivers = Some(1);
        s.max_in_flight = Some(1);
        s.max_messages_per_receive = Some(1);
        s.drain_grace_s = Some(1);
    });
    let slow = Arc::new(Slow {
        inner: common::engine(),
        delay: Duration::from_secs(5),
    });
    let result = interrupt(&backend, slow, &settings, 1, |imds| {
        imds.lifecycle_state = Some("Terminated");
    })
    .await;
    assert_eq!(result.notice, Some(Notice::ScaleIn));
    assert_eq!(result.receives_after_notice, 0);
    assert!(
        result.stopped_within < Duration::from_secs(3),
        "{:?}",
        result.stopped_within
    );
    let summary = result.summary;
    assert_eq!((summary.done, summary.released), (1, 1), "{summary:?}");
    let rest = finish_the_rest(&backend, jobs).await;
    assert_eq!(rest.done + summary.done, jobs as u64, "each job done once");
}
both_backends!(a_scale_in_releases_what_cannot_finish, 4);

/// `dispatcher run --instance-metadata-url`: the binary watches the service and exits cleanly
/// after draining for the notice (the Auto Scaling group terminating it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_command_drains_on_a_notice_and_exits() {
    let backend = Backend::moto(4).await;
    let state = Shared::default();
    state.lock().expect("lock").lifecycle_state = Some("Terminated");
    let url = serve_imds(state).await;
    let log = backend.dir.path().join("run.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .args(backend.cli_args())
        .arg("--model")
        .arg(common::fixture_model_path())
        .args(["--wait-time-s", "1", "--instance-metadata-poll-s", "1"])
        .args(["--instance-metadata-url", &url])
        .envs(backend.cli_env())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn dispatcher");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dispatcher run did not stop on the notice within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{text}");
    assert!(text.contains("interruption notice"), "{text}");
    assert!(text.contains("ScaleIn"), "{text}");
}

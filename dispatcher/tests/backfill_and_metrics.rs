//! Backfill skips inputs that already have a result for the model; metrics reach CloudWatch
//! (moto) and the Prometheus endpoint.

mod common;

use std::time::Duration;

use common::{clip, engine, records, run_until_idle, settings, Backend};
use dispatcher::backfill::{backfill, BackfillSettings};
use dispatcher::job::{JobMessage, Prefix};
use dispatcher::metrics::{CloudWatchSink, MetricEvent, Sink, Stage};

async fn backfill_skips_done_inputs(backend: Backend) {
    for key in ["bf/a.wav", "bf/b.wav", "bf/c.wav"] {
        backend.put_input(key, &clip("espeak_short.wav")).await;
    }
    backend
        .put_input("elsewhere/d.wav", &clip("espeak_short.wav"))
        .await;
    let first = JobMessage::new("first", &backend.input("bf/a.wav"));
    backend
        .send(&serde_json::to_string(&first).expect("json"))
        .await;
    let summary = run_until_idle(&backend, engine(), &settings(&backend, |_| {})).await;
    assert_eq!(summary.done, 1);

    let bf = BackfillSettings {
        source: Prefix::parse_uri(&format!("s3://{}/bf/", backend.input_bucket)).expect("prefix"),
        output: backend.output.clone(),
        model_id: engine().model_id().to_owned(),
        diarizer_model_id: None,
        max_messages_per_s: 1000,
        dry_run: false,
    };
    let mut pages = 0;
    let report = backfill(backend.store.as_ref(), backend.queue.as_ref(), &bf, |_| {
        pages += 1
    })
    .await
    .expect("backfill");
    assert_eq!(
        (report.listed, report.skipped_done, report.enqueued),
        (3, 1, 2),
        "{report:?}"
    );
    assert!(pages >= 1);
    let summary = run_until_idle(&backend, engine(), &settings(&backend, |_| {})).await;
    assert_eq!((summary.done, summary.already_done), (2, 0), "{summary:?}");
    assert_eq!(records(&backend).await.0.len(), 3);

    // Everything done now: a second backfill sends nothing.
    let again = backfill(backend.store.as_ref(), backend.queue.as_ref(), &bf, |_| {})
        .await
        .expect("backfill");
    assert_eq!((again.skipped_done, again.enqueued), (3, 0));

    // Diarized results are another set: none exists yet, so all three are enqueued, and the
    // jobs ask for diarization (this consumer has no diarizer: each ends as a typed failure
    // under the diarized id, and the plain results stay as they were).
    let diarized = BackfillSettings {
        diarizer_model_id: Some("sortformer-test".into()),
        ..bf.clone()
    };
    let report = backfill(
        backend.store.as_ref(),
        backend.queue.as_ref(),
        &diarized,
        |_| {},
    )
    .await
    .expect("diarized backfill");
    assert_eq!((report.skipped_done, report.enqueued), (0, 3), "{report:?}");
    let summary = run_until_idle(&backend, engine(), &settings(&backend, |_| {})).await;
    assert_eq!((summary.done, summary.failed), (0, 3), "{summary:?}");
    let plain = backfill(backend.store.as_ref(), backend.queue.as_ref(), &bf, |_| {})
        .await
        .expect("backfill");
    assert_eq!((plain.skipped_done, plain.enqueued), (3, 0));
}
both_backends!(backfill_skips_done_inputs, 3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_reach_cloudwatch_on_moto() {
    let config = common::moto::sdk_config().await;
    let client = dispatcher::aws::cloudwatch(&config);
    let namespace = format!("DispatcherTest/{}", uuid::Uuid::new_v4().simple());
    let sink = CloudWatchSink::new(client.clone(), namespace.clone());
    // 1200 points (over one request's 1000), plus values CloudWatch would reject.
    let mut datums: Vec<_> = (0..1200)
        .filter_map(|i| {
            MetricEvent::StageSeconds {
                stage: Stage::Inference,
                seconds: 0.001 * i as f64,
            }
            .datum()
        })
        .collect();
    datums.extend(MetricEvent::Rtfx(f64::NAN).datum());
    datums.extend(
        MetricEvent::Failure {
            reason: "too_short",
        }
        .datum(),
    );
    sink.publish(datums).await.expect("PutMetricData accepted");

    let listed = client
        .list_metrics()
        .namespace(&namespace)
        .send()
        .await
        .expect("list_metrics");
    let mut names: Vec<String> = listed
        .metrics()
        .iter()
        .filter_map(|m| m.metric_name().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(
        names,
        vec!["Failures".to_owned(), "StageLatency".to_owned()]
    );
    let now = std::time::SystemTime::now();
    let stats = client
        .get_metric_statistics()
        .namespace(&namespace)
        .metric_name("StageLatency")
        .dimensions(
            aws_sdk_cloudwatch::types::Dimension::builder()
                .name("Stage")
                .value("inference")
                .build(),
        )
        .start_time((now - Duration::from_secs(600)).into())
        .end_time((now + Duration::from_secs(600)).into())
        .period(60)
        .statistics(aws_sdk_cloudwatch::types::Statistic::SampleCount)
        .send()
        .await
        .expect("get_metric_statistics");
    let count: f64 = stats
        .datapoints()
        .iter()
        .filter_map(|d| d.sample_count())
        .sum();
    assert_eq!(count, 1200.0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_endpoint_serves_job_metrics() {
    let backend = Backend::local(3).await;
    backend.put_input("m.wav", &clip("espeak_short.wav")).await;
    let msg = JobMessage::new("m", &backend.input("m.wav"));
    backend
        .send(&serde_json::to_string(&msg).expect("json"))
        .await;
    let s = settings(&backend, |a| {
        a.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"))
    });
    let metrics = dispatcher::app::MetricsRuntime::start(&s, None)
        .await
        .expect("metrics");
    let addr = metrics.http_addr.expect("bound");
    let parts = dispatcher::app::ConsumerParts {
        queue: backend.queue.clone(),
        store: backend.store.clone(),
        transcriber: engine(),
        diarizer: None,
    };
    let consumer = dispatcher::app::consumer(&s, parts, &metrics, true).expect("consumer");
    let summary = consumer
        .run(tokio_util::sync::CancellationToken::new())
        .await;
    assert_eq!(summary.done, 1);
    tokio::time::sleep(Duration::from_millis(200)).await; // let the aggregator fold the events
    let body = http_get(addr, "/metrics").await;
    assert!(
        body.contains("dispatcher_jobs_total{outcome=\"done\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("dispatcher_stage_seconds_count{stage=\"inference\"} 1"),
        "{body}"
    );
    assert!(body.contains("dispatcher_rtfx_count 1"), "{body}");
    assert!(http_get(addr, "/health").await.starts_with("ok"));
    metrics.shutdown().await;
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

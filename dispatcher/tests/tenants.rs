//! Tenant ownership (`tenants_file`): a job runs only as a tenant that owns both its input and
//! its result location; one that reaches outside is refused before anything is read or
//! written (no result, no failure record) and its message ends in the dead-letter queue. Both
//! backends.

mod common;

use common::{clip, engine, records, run_until_idle, settings, Backend};
use dispatcher::job::JobMessage;

async fn jobs_outside_their_tenant_touch_nothing(backend: Backend) {
    let out = &backend.output;
    let tenants = format!(
        "[tenants.acme]\ninputs = [\"s3://{input}/acme/\"]\noutputs = [\"s3://{bucket}/{prefix}\"]\n\
         [tenants.globex]\ninputs = [\"s3://{input}/globex\"]\noutputs = [\"s3://{bucket}/globex/\"]\n",
        input = backend.input_bucket,
        bucket = out.bucket,
        prefix = out.prefix,
    );
    let file = backend.dir.path().join("tenants.toml");
    std::fs::write(&file, tenants).expect("tenants file");
    let audio = clip("espeak_short.wav");
    // (key, named tenant): only the first stays inside its tenant.
    let jobs = [
        ("acme/a.wav", None),           // acme's input, acme's output (the default)
        ("globex/b.wav", None),         // globex's input, but acme's output
        ("other/c.wav", None),          // nobody's input
        ("acme/d.wav", Some("globex")), // acme's input, run as globex
        ("globex-evil/e.wav", None),    // only starts like globex's prefix
    ];
    for (i, (key, tenant)) in jobs.iter().enumerate() {
        backend.put_input(key, &audio).await;
        let mut message = JobMessage::new(format!("tenant-{i}"), &backend.input(key));
        message.tenant = tenant.map(str::to_owned);
        backend
            .send(&serde_json::to_string(&message).expect("json"))
            .await;
    }
    let settings = settings(&backend, |s| s.tenants_file = Some(file.clone()));
    let summary = run_until_idle(&backend, engine(), &settings).await;
    assert_eq!(summary.done, 1, "{summary:?}");
    let (manifests, failures) = records(&backend).await;
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    assert!(manifests[0].contains("/acme/a.wav/"), "{manifests:?}");
    assert!(
        failures.is_empty(),
        "no record written outside: {failures:?}"
    );
    let mut dead: Vec<String> = backend
        .dead_letters()
        .await
        .iter()
        .map(|body| {
            let v: serde_json::Value = serde_json::from_str(body).expect("job json");
            v["job_id"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    dead.sort();
    assert_eq!(dead, ["tenant-1", "tenant-2", "tenant-3", "tenant-4"]);
}
both_backends!(jobs_outside_their_tenant_touch_nothing, 2);

/// A tenants file that does not parse is refused when the settings are read, with its path.
#[test]
fn a_bad_tenants_file_is_a_settings_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, "[tenants.x]\ninputs = [\"s3://in/\"]\n").expect("write");
    let error = dispatcher::config::SettingsArgs {
        tenants_file: Some(file),
        ..Default::default()
    }
    .resolve()
    .expect_err("no outputs");
    assert!(error.to_string().contains("tenants.toml"), "{error}");
}

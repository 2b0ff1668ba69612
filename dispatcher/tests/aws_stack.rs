//! The CloudFormation stack (`infra/cloudformation/`): cfn-lint, least-privilege checks on the
//! template and on `infra/iam/dispatcher-policy.json`, and a deploy into this binary's
//! moto_server followed by an upload that the real `dispatcher run` turns into a transcript.
//!
//! `aws_stack.py` beside this file does the template work (cfn-lint's decoder reads the short
//! tags). Without cfn-lint the tests skip loudly, unless `REQUIRE_INFRA_TOOLS` is set (CI).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn helper() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/aws_stack.py")
}

fn template() -> PathBuf {
    repo().join("infra/cloudformation/parakeet-fleet.yaml")
}

fn policy_json() -> PathBuf {
    repo().join("infra/iam/dispatcher-policy.json")
}

/// Whether cfn-lint (and its Python decoder) is here; a failure when CI requires it.
fn tools_present(test: &str) -> Result<bool> {
    Ok(common::tools::present(
        test,
        "REQUIRE_INFRA_TOOLS",
        &[
            ("cfn-lint", &["cfn-lint", "--version"]),
            (
                "python3 with cfnlint and boto3",
                &["python3", "-c", "import cfnlint.decode, boto3"],
            ),
        ],
        "pip install -r scripts/ci-requirements.txt",
    ))
}

fn python(args: &[&std::ffi::OsStr]) -> Result<Output> {
    Command::new("python3")
        .arg(helper())
        .args(args)
        .output()
        .context("running aws_stack.py")
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn templates() -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(repo().join("infra/cloudformation"))? {
        let path = entry?.path();
        if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            found.push(path);
        }
    }
    found.sort();
    ensure!(!found.is_empty(), "no templates under infra/cloudformation");
    Ok(found)
}

#[test]
fn cfn_lint_passes_and_catches_a_broken_template() -> Result<()> {
    if !tools_present("cfn_lint_passes_and_catches_a_broken_template")? {
        return Ok(());
    }
    let all = templates()?;
    let lint = Command::new("cfn-lint").args(&all).output()?;
    ensure!(lint.status.success(), "cfn-lint {all:?}: {}", text(&lint));

    // The same linter on a copy with a misspelt property and a dangling reference fails.
    let dir = tempfile::tempdir()?;
    let broken = dir.path().join("broken.yaml");
    let source = std::fs::read_to_string(template())?;
    let mutated = source
        .replacen("VisibilityTimeout: 300", "VisibilityTimeoutSeconds: 300", 1)
        .replacen("!GetAtt DeadLetterQueue.Arn", "!GetAtt DeadLetterQ.Arn", 1);
    ensure!(mutated != source, "the mutation no longer applies");
    std::fs::write(&broken, mutated)?;
    let lint = Command::new("cfn-lint").arg(&broken).output()?;
    let out = text(&lint);
    ensure!(!lint.status.success(), "cfn-lint passed a broken template");
    ensure!(
        out.contains("VisibilityTimeoutSeconds") && out.contains("DeadLetterQ"),
        "{out}"
    );
    Ok(())
}

#[test]
fn least_privilege_checks_pass_and_each_can_fail() -> Result<()> {
    if !tools_present("least_privilege_checks_pass_and_each_can_fail")? {
        return Ok(());
    }
    let check = python(&[
        "check".as_ref(),
        template().as_os_str(),
        "--policy-json".as_ref(),
        policy_json().as_os_str(),
    ])?;
    ensure!(check.status.success(), "{}", text(&check));

    // Every check against a template broken on purpose (the mutations live in aws_stack.py).
    let self_test = python(&["self-test".as_ref(), template().as_os_str()])?;
    let out = text(&self_test);
    ensure!(self_test.status.success(), "{out}");
    ensure!(out.matches("caught ").count() >= 14, "{out}");

    // The standalone policy: sqs:SendMessage back in is caught, and so is its drift from the
    // template's consumer role.
    let dir = tempfile::tempdir()?;
    let bad = dir.path().join("policy.json");
    let source = std::fs::read_to_string(policy_json())?;
    let mutated = source.replacen(
        "\"sqs:GetQueueAttributes\"",
        "\"sqs:GetQueueAttributes\", \"sqs:SendMessage\"",
        1,
    );
    ensure!(mutated != source, "the mutation no longer applies");
    std::fs::write(&bad, mutated)?;
    let check = python(&[
        "check".as_ref(),
        template().as_os_str(),
        "--policy-json".as_ref(),
        bad.as_os_str(),
    ])?;
    let out = text(&check);
    ensure!(!check.status.success(), "{out}");
    ensure!(
        out.contains("consumers must not send messages") && out.contains("ConsumeJobs is"),
        "{out}"
    );
    Ok(())
}

fn output<'a>(stack: &'a Value, key: &str) -> Result<&'a str> {
    stack["outputs"][key]
        .as_str()
        .with_context(|| format!("stack output {key}"))
}

async fn queue_depth(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<u64> {
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await?
        .attributes
        .unwrap_or_default();
    Ok(attrs.values().map(|v| v.parse::<u64>().unwrap_or(0)).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployed_stack_turns_an_upload_into_a_transcript() -> Result<()> {
    if !tools_present("deployed_stack_turns_an_upload_into_a_transcript")? {
        return Ok(());
    }
    let endpoint = common::moto::moto().endpoint.clone();
    let stack_name = format!("pk{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let clip = repo().join("models/tests/fixtures/clips/espeak_us.wav");
    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("audio/tests/data/random.bin");
    let deploy = python(&[
        "deploy".as_ref(),
        template().as_os_str(),
        "--endpoint".as_ref(),
        endpoint.as_ref(),
        "--stack".as_ref(),
        stack_name.as_ref(),
        "--clip".as_ref(),
        clip.as_os_str(),
        "--bad".as_ref(),
        bad.as_os_str(),
    ])?;
    ensure!(deploy.status.success(), "deploy: {}", text(&deploy));
    let stack: Value = serde_json::from_slice(&deploy.stdout).context("deploy's JSON")?;
    let summary = serde_json::to_string_pretty(&stack)?;

    // What moto 5.2.5's CloudFormation cannot create; the deploy removed exactly these.
    let removed: Vec<&str> = stack["removed_types"]
        .as_array()
        .context("removed_types")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        removed,
        [
            "AWS::AutoScaling::ScalingPolicy",
            "AWS::CloudWatch::Alarm",
            "AWS::S3::BucketPolicy",
            "AWS::SNS::Subscription",
            "AWS::SQS::QueuePolicy",
        ]
    );

    // The queue as the template made it: redrive to the DLQ, the dispatcher's visibility.
    let attrs = &stack["queue_attributes"];
    assert_eq!(attrs["VisibilityTimeout"], "300", "{summary}");
    assert_eq!(attrs["SqsManagedSseEnabled"], "true", "{summary}");
    let redrive: Value = serde_json::from_str(attrs["RedrivePolicy"].as_str().context("redrive")?)?;
    assert!(redrive["maxReceiveCount"].as_u64() >= Some(3), "{summary}");
    assert!(
        redrive["deadLetterTargetArn"]
            .as_str()
            .is_some_and(|a| a.ends_with("-jobs-dlq")),
        "{summary}"
    );
    assert_eq!(stack["input_sse"], "AES256", "{summary}");
    let metadata = &stack["launch_template"]["MetadataOptions"];
    assert_eq!(metadata["HttpTokens"], "required", "{summary}");
    assert_eq!(metadata["HttpPutResponseHopLimit"], 2, "{summary}");
    let distribution = &stack["group"]["MixedInstancesPolicy"]["InstancesDistribution"];
    assert_eq!(
        distribution["OnDemandPercentageAboveBaseCapacity"], 0,
        "spot by default: {summary}"
    );

    // The two uploads under the prefix, and only they, arrived as S3 event notifications.
    let bucket = output(&stack, "InputBucketName")?;
    let mut notified: Vec<String> = stack["notified"]
        .as_array()
        .context("notified")?
        .iter()
        .map(|n| {
            assert_eq!(n[0], "ObjectCreated:Put", "{summary}");
            assert_eq!(n[1], bucket, "{summary}");
            percent_encoding::percent_decode_str(n[2].as_str().unwrap_or_default())
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    notified.sort();
    let mut uploaded: Vec<String> = stack["uploads"]
        .as_object()
        .context("uploads")?
        .values()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    uploaded.sort();
    assert_eq!(notified, uploaded, "{summary}");
    assert_eq!(attrs["ApproximateNumberOfMessages"], "2", "{summary}");

    // The dispatcher, configured by the dispatcher.toml the user data writes. The model path
    // is the instance's; the flag points at the fixture instead (flags beat the file).
    // Its `instance_metadata_url` (EC2's) is overridden by a flag with a closed local port: no
    // instance metadata here, and polls that fail must not disturb the jobs.
    let dir = tempfile::tempdir()?;
    let toml_path = dir.path().join("dispatcher.toml");
    let toml: String = stack["dispatcher_toml"]
        .as_str()
        .context("dispatcher_toml")?
        .to_owned();
    std::fs::write(&toml_path, &toml)?;
    let queue_url = output(&stack, "JobQueueUrl")?;
    ensure!(
        toml.contains(&format!("queue_url = \"{queue_url}\"")),
        "{toml}"
    );
    let results = output(&stack, "ResultsUri")?;
    ensure!(
        toml.contains(&format!("output_uri = \"{results}\"")),
        "{toml}"
    );
    let log = dir.path().join("dispatcher.log");
    let run = tokio::task::spawn_blocking({
        let toml_path = toml_path.clone();
        let log = log.clone();
        let env: Vec<(String, String)> = vec![
            ("AWS_ENDPOINT_URL".into(), endpoint.clone()),
            ("AWS_ACCESS_KEY_ID".into(), "testing".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "testing".into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
        ];
        move || {
            Command::new(env!("CARGO_BIN_EXE_dispatcher"))
                .args(["run", "--exit-when-idle", "--config"])
                .arg(&toml_path)
                .arg("--model")
                .arg(common::fixture_model_path())
                .args(["--s3-force-path-style", "--wait-time-s", "1"])
                .args(["--metrics-flush-s", "1", "--receivers", "1"])
                // The node's listener and metadata service, moved to this machine's loopback.
                .args(["--metrics-listen", "127.0.0.1:0"])
                .args(["--instance-metadata-url", "http://127.0.0.1:9"])
                .envs(env)
                .env("RUST_LOG", "info")
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log file"))
                .status()
        }
    });
    let status = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .context("dispatcher did not exit within 90 s")???;
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    // Exit status 3: the run worked through the queue and one job (the non-audio file) failed.
    ensure!(status.code() == Some(3), "dispatcher: {status}\n{log_text}");
    ensure!(
        log_text.contains("audio-s/s") && log_text.contains("failed 1"),
        "the closing report:\n{log_text}"
    );

    // Results: the clip's manifest and transcript side by side, the non-audio file's failure
    // record, nothing else finished.
    let config = common::moto::sdk_config().await;
    let s3 = dispatcher::aws::s3(&config, true);
    let sqs = dispatcher::aws::sqs(&config);
    let results_bucket = output(&stack, "ResultsBucketName")?;
    let prefix = results
        .strip_prefix(&format!("s3://{results_bucket}/"))
        .context("ResultsUri names the results bucket")?;
    let listed = s3
        .list_objects_v2()
        .bucket(results_bucket)
        .prefix(prefix)
        .send()
        .await?;
    let keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    let manifests: Vec<&&str> = keys
        .iter()
        .filter(|k| k.ends_with("/manifest.json"))
        .collect();
    let failures: Vec<&&str> = keys
        .iter()
        .filter(|k| k.ends_with("/failure.json"))
        .collect();
    ensure!(
        manifests.len() == 1 && failures.len() == 1,
        "{keys:?}\n{log_text}"
    );
    let dir_of = |k: &str| {
        k.rsplit_once('/')
            .map(|(d, _)| d.to_owned())
            .unwrap_or_default()
    };
    let transcript_key = format!("{}/transcript.json", dir_of(manifests[0]));
    ensure!(keys.contains(&transcript_key.as_str()), "{keys:?}");
    let transcript = s3
        .get_object()
        .bucket(results_bucket)
        .key(&transcript_key)
        .send()
        .await?
        .body
        .collect()
        .await?
        .into_bytes();
    let transcript: Value = serde_json::from_slice(&transcript)?;
    // The fixture model's words are not meaningful; that there are some is.
    ensure!(
        transcript["text"]
            .as_str()
            .is_some_and(|t| !t.trim().is_empty()),
        "{transcript}"
    );

    // Nothing left: the queue is drained and nothing went to the dead-letter queue.
    ensure!(queue_depth(&sqs, queue_url).await? == 0, "{log_text}");
    let dlq = output(&stack, "DeadLetterQueueUrl")?;
    ensure!(queue_depth(&sqs, dlq).await? == 0, "{log_text}");

    // Every metric of the dispatcher's namespace that the alarms and the dashboard read is
    // one it publishes (name and dimension names; this run published all but two values).
    let cloudwatch = aws_sdk_cloudwatch::Client::new(&config);
    let namespace = "Transcription/Dispatcher";
    let published = cloudwatch
        .list_metrics()
        .namespace(namespace)
        .send()
        .await?;
    let shapes: Vec<(String, Vec<String>, Vec<String>)> = published
        .metrics()
        .iter()
        .map(|m| {
            let dims = m.dimensions();
            (
                m.metric_name().unwrap_or_default().to_owned(),
                dims.iter()
                    .map(|d| d.name().unwrap_or_default().to_owned())
                    .collect(),
                dims.iter()
                    .map(|d| d.value().unwrap_or_default().to_owned())
                    .collect(),
            )
        })
        .collect();
    let read = stack["template_metrics"]
        .as_array()
        .context("template_metrics")?;
    ensure!(read.len() >= 6, "{read:?}");
    for entry in read {
        let name = entry[0].as_str().context("metric name")?;
        let dims = entry[1].as_object().context("dimensions")?;
        let names: Vec<String> = dims.keys().cloned().collect();
        ensure!(
            shapes.iter().any(|(n, d, _)| n == name && *d == names),
            "the template reads {name} {names:?}, the dispatcher published {shapes:?}"
        );
    }
    for (name, dim, value) in [
        ("Jobs", "Outcome", "done"),
        ("Jobs", "Outcome", "failed"),
        ("StageLatency", "Stage", "end_to_end"),
    ] {
        ensure!(
            shapes
                .iter()
                .any(|(n, d, v)| n == name && d == &[dim] && v == &[value]),
            "{name} {dim}={value} not published: {shapes:?}"
        );
    }
    Ok(())
}

//! The same test bodies run against two backends: the local spool + directory store, and
//! SQS + S3 on moto_server.

use std::sync::Arc;

use aws_sdk_sqs::types::QueueAttributeName;
use bytes::Bytes;
use dispatcher::job::{ObjectRef, Prefix};
use dispatcher::queue::spool::SpoolQueue;
use dispatcher::queue::sqs::SqsQueue;
use dispatcher::queue::Queue;
use dispatcher::store::local::LocalStore;
use dispatcher::store::s3::S3Store;
use dispatcher::store::{ObjectStore, PutOutcome};

pub enum Kind {
    Local {
        spool: SpoolQueue,
        store: LocalStore,
    },
    Moto {
        s3: aws_sdk_s3::Client,
        sqs: aws_sdk_sqs::Client,
        queue_url: String,
        dlq_url: String,
    },
}

pub struct Backend {
    pub queue: Arc<dyn Queue>,
    pub store: Arc<dyn ObjectStore>,
    pub input_bucket: String,
    pub output: Prefix,
    pub kind: Kind,
    pub max_receives: u32,
    /// Keeps the local directories alive.
    pub dir: tempfile::TempDir,
}

fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_owned()
}

impl Backend {
    pub async fn local(max_receives: u32) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let spool = SpoolQueue::open(dir.path().join("spool"), max_receives).expect("spool");
        let store = LocalStore::open(dir.path().join("store")).expect("store");
        Self {
            queue: Arc::new(spool.clone()),
            store: Arc::new(store.clone()),
            input_bucket: "inputs".into(),
            output: Prefix::parse_uri("s3://results/transcripts/").expect("prefix"),
            kind: Kind::Local { spool, store },
            max_receives,
            dir,
        }
    }

    pub async fn moto(max_receives: u32) -> Self {
        let config = super::moto::sdk_config().await;
        let s3 = dispatcher::aws::s3(&config, true);
        let sqs = dispatcher::aws::sqs(&config);
        let id = short_id();
        let (input_bucket, output_bucket) = (format!("in-{id}"), format!("out-{id}"));
        for bucket in [&input_bucket, &output_bucket] {
            s3.create_bucket()
                .bucket(bucket)
                .send()
                .await
                .expect("create bucket");
        }
        let dlq_url = sqs
            .create_queue()
            .queue_name(format!("dlq-{id}"))
            .send()
            .await
            .expect("create dlq")
            .queue_url
            .expect("dlq url");
        let dlq_arn = sqs
            .get_queue_attributes()
            .queue_url(&dlq_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .expect("dlq attributes")
            .attributes
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .expect("dlq arn");
        let redrive = serde_json::json!({
            "deadLetterTargetArn": dlq_arn,
            "maxReceiveCount": max_receives.to_string(),
        });
        let queue_url = sqs
            .create_queue()
            .queue_name(format!("jobs-{id}"))
            .attributes(QueueAttributeName::RedrivePolicy, redrive.to_string())
            .attributes(QueueAttributeName::VisibilityTimeout, "30")
            .send()
            .await
            .expect("create queue")
            .queue_url
            .expect("queue url");
        let dir = tempfile::tempdir().expect("tempdir");
        Self {
            queue: Arc::new(SqsQueue::new(sqs.clone(), queue_url.clone())),
            store: Arc::new(S3Store::new(s3.clone(), None)),
            input_bucket,
            output: Prefix::parse_uri(&format!("s3://{output_bucket}/transcripts/"))
                .expect("prefix"),
            kind: Kind::Moto {
                s3,
                sqs,
                queue_url,
                dlq_url,
            },
            max_receives,
            dir,
        }
    }

    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Local { .. } => "local",
            Kind::Moto { .. } => "moto",
        }
    }

    pub fn input(&self, key: &str) -> ObjectRef {
        ObjectRef::new(&self.input_bucket, key)
    }

    pub async fn put_input(&self, key: &str, bytes: &[u8]) {
        match &self.kind {
            Kind::Local { store, .. } => {
                let out = store
                    .put_if_absent(
                        &self.input_bucket,
                        key,
                        Bytes::copy_from_slice(bytes),
                        "audio/wav",
                    )
                    .await
                    .expect("put input");
                assert_eq!(out, PutOutcome::Created);
            }
            Kind::Moto { s3, .. } => {
                s3.put_object()
                    .bucket(&self.input_bucket)
                    .key(key)
                    .body(bytes.to_vec().into())
                    .send()
                    .await
                    .expect("put input");
            }
        }
    }

    pub async fn send(&self, body: &str) {
        let results = self
            .queue
            .send_batch(&[body.to_owned()])
            .await
            .expect("send");
        results.into_iter().for_each(|r| r.expect("send entry"));
    }

    /// Bodies that ended in the dead-letter queue (folder).
    pub async fn dead_letters(&self) -> Vec<String> {
        match &self.kind {
            Kind::Local { spool, .. } => spool.dead_bodies().expect("dead letters"),
            Kind::Moto { sqs, dlq_url, .. } => {
                let out = sqs
                    .receive_message()
                    .queue_url(dlq_url)
                    .max_number_of_messages(10)
                    .visibility_timeout(0)
                    .send()
                    .await
                    .expect("receive dlq");
                out.messages()
                    .iter()
                    .filter_map(|m| m.body().map(str::to_owned))
                    .collect()
            }
        }
    }

    pub async fn pending(&self) -> u64 {
        self.queue.pending().await.expect("pending")
    }

    /// Every key under the output prefix.
    pub async fn output_keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        let mut next = None;
        loop {
            let page = self
                .store
                .list_page(&self.output.bucket, &self.output.prefix, next)
                .await
                .expect("list outputs");
            keys.extend(page.objects.into_iter().map(|o| o.key));
            next = page.next;
            if next.is_none() {
                return keys;
            }
        }
    }

    pub async fn read(&self, key: &str) -> Vec<u8> {
        self.store
            .get(&ObjectRef::new(&self.output.bucket, key), 64 << 20, None)
            .await
            .unwrap_or_else(|e| panic!("reading {key}: {e}"))
            .to_vec()
    }

    /// Flags that point the dispatcher binary at this backend.
    pub fn cli_args(&self) -> Vec<String> {
        match &self.kind {
            Kind::Local { spool, store } => vec![
                "local".into(),
                "--spool".into(),
                spool.dir().display().to_string(),
                "--store".into(),
                store.root().display().to_string(),
                "--output-uri".into(),
                self.output.uri(),
                "--max-receives".into(),
                self.max_receives.to_string(),
            ],
            Kind::Moto { queue_url, .. } => vec![
                "run".into(),
                "--queue-url".into(),
                queue_url.clone(),
                "--output-uri".into(),
                self.output.uri(),
                "--s3-force-path-style".into(),
            ],
        }
    }

    /// Environment for the dispatcher binary (moto endpoint and static credentials).
    pub fn cli_env(&self) -> Vec<(String, String)> {
        match &self.kind {
            Kind::Local { .. } => vec![],
            Kind::Moto { .. } => vec![
                (
                    "AWS_ENDPOINT_URL".into(),
                    super::moto::moto().endpoint.clone(),
                ),
                ("AWS_ACCESS_KEY_ID".into(), "testing".into()),
                ("AWS_SECRET_ACCESS_KEY".into(), "testing".into()),
                ("AWS_REGION".into(), "us-east-1".into()),
                ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
            ],
        }
    }
}

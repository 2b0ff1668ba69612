//! An S3 double that keeps every object in memory, for the pipeline benchmark's `doubles` step.
//!
//! Why not s3s-fs alone: under 544 jobs in flight on a 16-core host its answers took about 200 ms
//! each while cores stood idle (docs/benchmarks.md, session 35), so the benchmark measured the
//! double, not the dispatcher. It streams each GET's body in 4 KiB reads through tokio's
//! blocking pool, reads an object it did not write once more for its MD5 on every HEAD and GET,
//! and writes each object as three files renamed into place from one directory.
//!
//! Here the protocol (routing, SigV4 including streaming trailers, XML) is the `s3s` crate's;
//! this file holds only the store: HeadObject, GetObject (with If-Match), PutObject (with
//! If-None-Match / If-Match, checked and applied under one lock, and the request's checksums
//! verified), ListObjectsV2 (prefix, continuation, start-after), CreateBucket and HeadBucket.
//! Everything else answers NotImplemented. check.py tests it with boto3.
//!
//! Usage: s3-memory --port 8015 --access-key K --secret-key S --preload ROOT [--latency-ms 20]
//! (each directory under ROOT is a bucket, the files below it its objects; --latency-ms delays
//! every answer, as S3's time per request would).

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use bytes::{Bytes, BytesMut};
use clap::Parser;
use futures::TryStreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use md5::{Digest, Md5};
use s3s::auth::SimpleAuth;
use s3s::checksum::ChecksumHasher;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{Body, S3, S3Request, S3Response, S3Result, s3_error};
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8015)]
    port: u16,
    /// The one key pair whose SigV4 signatures are accepted (others answer AccessDenied).
    #[arg(long)]
    access_key: String,
    #[arg(long)]
    secret_key: String,
    /// Directory whose subdirectories become buckets holding their files as objects.
    #[arg(long)]
    preload: Option<PathBuf>,
    /// Added before every answer, as S3's own time for a small request (tens of milliseconds)
    /// on top of the network's: how a client behaves against S3 rather than on loopback.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
}

struct Object {
    body: Bytes,
    /// Hex MD5 of the body, as S3 names a single-part object.
    etag: String,
    last_modified: Timestamp,
}

impl Object {
    fn new(body: Bytes) -> Self {
        Self {
            etag: Md5::digest(&body)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            body,
            last_modified: Timestamp::from(SystemTime::now()),
        }
    }

    fn etag(&self) -> ETag {
        ETag::Strong(self.etag.clone())
    }

    /// RFC 9110 If-Match: `*` or a strong comparison with the current ETag.
    fn matches(&self, condition: &ETagCondition) -> bool {
        match condition {
            ETagCondition::Any => true,
            ETagCondition::ETag(expected) => self.etag().strong_cmp(expected),
        }
    }
}

type Bucket = BTreeMap<String, Arc<Object>>;

#[derive(Default)]
struct Memory {
    buckets: RwLock<HashMap<String, Bucket>>,
    latency: Duration,
}

impl Memory {
    /// S3's own time for the request (`--latency-ms`).
    async fn answer_time(&self) {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }

    fn object(&self, bucket: &str, key: &str) -> S3Result<Arc<Object>> {
        let buckets = self.buckets.read().expect("store lock");
        let Some(objects) = buckets.get(bucket) else {
            return Err(s3_error!(NoSuchBucket));
        };
        objects
            .get(key)
            .cloned()
            .ok_or_else(|| s3_error!(NoSuchKey))
    }

    /// The object a HEAD or GET names, once its If-Match holds (whole objects, no versions).
    fn read(
        &self,
        bucket: &str,
        key: &str,
        whole: bool,
        version_id: &Option<String>,
        if_match: &Option<ETagCondition>,
    ) -> S3Result<Arc<Object>> {
        if !whole || version_id.is_some() {
            return Err(s3_error!(NotImplemented, "ranges, parts and versions"));
        }
        let object = self.object(bucket, key)?;
        if let Some(condition) = if_match
            && !object.matches(condition)
        {
            return Err(s3_error!(PreconditionFailed));
        }
        Ok(object)
    }

    /// Loads `root/<bucket>/<key...>`, hashing on every core.
    fn preload(&self, root: &Path) -> anyhow::Result<(usize, u64)> {
        let mut files = Vec::new();
        for entry in walkdir::WalkDir::new(root).min_depth(1).follow_links(true) {
            let entry = entry.with_context(|| format!("walking {}", root.display()))?;
            let relative = entry
                .path()
                .strip_prefix(root)?
                .to_string_lossy()
                .into_owned();
            if entry.file_type().is_dir() {
                if entry.depth() == 1 {
                    self.buckets
                        .write()
                        .expect("store lock")
                        .entry(relative)
                        .or_default();
                }
                continue;
            }
            let Some((bucket, key)) = relative.split_once('/') else {
                continue; // a file directly under the root belongs to no bucket
            };
            files.push((bucket.to_owned(), key.to_owned(), entry.into_path()));
        }
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let chunk = files.len().div_ceil(threads).max(1);
        let loaded: Vec<anyhow::Result<Vec<(String, String, Object)>>> = std::thread::scope(|s| {
            let handles: Vec<_> = files
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        part.iter()
                            .map(|(bucket, key, path)| {
                                let body = std::fs::read(path)
                                    .with_context(|| format!("reading {}", path.display()))?;
                                Ok((bucket.clone(), key.clone(), Object::new(body.into())))
                            })
                            .collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("loader thread"))
                .collect()
        });
        let (mut count, mut bytes) = (0, 0);
        let mut buckets = self.buckets.write().expect("store lock");
        for part in loaded {
            for (bucket, key, object) in part? {
                count += 1;
                bytes += object.body.len() as u64;
                buckets
                    .entry(bucket)
                    .or_default()
                    .insert(key, Arc::new(object));
            }
        }
        Ok((count, bytes))
    }
}

/// Reads a request body, hashing what the request asked to be checked.
async fn read_body(body: StreamingBlob, checksum: &mut ChecksumHasher) -> S3Result<Bytes> {
    let mut stream = body;
    let mut out = BytesMut::new();
    while let Some(chunk) = stream
        .try_next()
        .await
        .map_err(|e| s3_error!(IncompleteBody, "reading the body: {e}"))?
    {
        checksum.update(&chunk);
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

#[async_trait::async_trait]
impl S3 for Memory {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.answer_time().await;
        let mut buckets = self.buckets.write().expect("store lock");
        if buckets.contains_key(&req.input.bucket) {
            return Err(s3_error!(BucketAlreadyOwnedByYou));
        }
        buckets.insert(req.input.bucket, Bucket::new());
        Ok(S3Response::new(CreateBucketOutput::default()))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.answer_time().await;
        if !self
            .buckets
            .read()
            .expect("store lock")
            .contains_key(&req.input.bucket)
        {
            return Err(s3_error!(NoSuchBucket));
        }
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.answer_time().await;
        let input = req.input;
        let whole = input.range.is_none() && input.part_number.is_none();
        let object = self.read(
            &input.bucket,
            &input.key,
            whole,
            &input.version_id,
            &input.if_match,
        )?;
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(object.body.len() as i64),
            e_tag: Some(object.etag()),
            last_modified: Some(object.last_modified.clone()),
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.answer_time().await;
        let input = req.input;
        let whole = input.range.is_none() && input.part_number.is_none();
        let object = self.read(
            &input.bucket,
            &input.key,
            whole,
            &input.version_id,
            &input.if_match,
        )?;
        Ok(S3Response::new(GetObjectOutput {
            content_length: Some(object.body.len() as i64),
            e_tag: Some(object.etag()),
            last_modified: Some(object.last_modified.clone()),
            body: Some(StreamingBlob::from(Body::from(object.body.clone()))),
            ..Default::default()
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.answer_time().await;
        let mut input = req.input;
        let Some(body) = input.body.take() else {
            return Err(s3_error!(IncompleteBody));
        };
        let mut checksum = ChecksumHasher::default();
        if input.checksum_crc32.is_some() {
            checksum.crc32 = Some(Default::default());
        }
        if input.checksum_crc32c.is_some() {
            checksum.crc32c = Some(Default::default());
        }
        if input.checksum_sha1.is_some() {
            checksum.sha1 = Some(Default::default());
        }
        if input.checksum_sha256.is_some() {
            checksum.sha256 = Some(Default::default());
        }
        if input.checksum_crc64nvme.is_some() {
            checksum.crc64nvme = Some(Default::default());
        }
        if let Some(algorithm) = &input.checksum_algorithm {
            match algorithm.as_str() {
                ChecksumAlgorithm::CRC32 => checksum.crc32 = Some(Default::default()),
                ChecksumAlgorithm::CRC32C => checksum.crc32c = Some(Default::default()),
                ChecksumAlgorithm::SHA1 => checksum.sha1 = Some(Default::default()),
                ChecksumAlgorithm::SHA256 => checksum.sha256 = Some(Default::default()),
                ChecksumAlgorithm::CRC64NVME => checksum.crc64nvme = Some(Default::default()),
                other => return Err(s3_error!(NotImplemented, "checksum algorithm {other}")),
            }
        }
        let bytes = read_body(body, &mut checksum).await?;
        // A streaming (aws-chunked) upload names its checksum in the trailer, read after the body.
        if let Some(trailers) = req.trailing_headers.as_ref().and_then(|t| t.take()) {
            let header = |name: &str| {
                trailers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            input.checksum_crc32 = input.checksum_crc32.or(header("x-amz-checksum-crc32"));
            input.checksum_crc32c = input.checksum_crc32c.or(header("x-amz-checksum-crc32c"));
            input.checksum_sha1 = input.checksum_sha1.or(header("x-amz-checksum-sha1"));
            input.checksum_sha256 = input.checksum_sha256.or(header("x-amz-checksum-sha256"));
            input.checksum_crc64nvme = input
                .checksum_crc64nvme
                .or(header("x-amz-checksum-crc64nvme"));
        }
        let computed = checksum.finalize();
        for (name, sent, got) in [
            ("crc32", &input.checksum_crc32, &computed.checksum_crc32),
            ("crc32c", &input.checksum_crc32c, &computed.checksum_crc32c),
            ("sha1", &input.checksum_sha1, &computed.checksum_sha1),
            ("sha256", &input.checksum_sha256, &computed.checksum_sha256),
            (
                "crc64nvme",
                &input.checksum_crc64nvme,
                &computed.checksum_crc64nvme,
            ),
        ] {
            if sent.is_some() && sent != got {
                return Err(s3_error!(
                    BadDigest,
                    "{name}: sent {sent:?}, body has {got:?}"
                ));
            }
        }
        let object = Arc::new(Object::new(bytes));
        let etag = object.etag();
        // The condition and the write under one lock: two racing create-only writes of one key
        // end in one 200 and one 412, as on S3.
        let mut buckets = self.buckets.write().expect("store lock");
        let Some(objects) = buckets.get_mut(&input.bucket) else {
            return Err(s3_error!(NoSuchBucket));
        };
        let existing = objects.get(&input.key);
        if let Some(ETagCondition::Any) = &input.if_none_match
            && existing.is_some()
        {
            return Err(s3_error!(PreconditionFailed, "the object exists"));
        }
        if let Some(condition) = &input.if_match
            && !existing.is_some_and(|o| o.matches(condition))
        {
            return Err(s3_error!(
                PreconditionFailed,
                "the object's ETag does not match"
            ));
        }
        objects.insert(input.key, object);
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag),
            checksum_crc32: computed.checksum_crc32,
            checksum_crc32c: computed.checksum_crc32c,
            checksum_sha1: computed.checksum_sha1,
            checksum_sha256: computed.checksum_sha256,
            checksum_crc64nvme: computed.checksum_crc64nvme,
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.answer_time().await;
        let input = req.input;
        if input.delimiter.is_some() {
            return Err(s3_error!(NotImplemented, "delimiters"));
        }
        let prefix = input.prefix.clone().unwrap_or_default();
        let max_keys = input.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        // Both the continuation token (the last key sent) and start-after mean "keys after".
        let after = [&input.continuation_token, &input.start_after]
            .into_iter()
            .flatten()
            .max()
            .cloned();
        let buckets = self.buckets.read().expect("store lock");
        let Some(objects) = buckets.get(&input.bucket) else {
            return Err(s3_error!(NoSuchBucket));
        };
        let start = match &after {
            Some(key) if *key >= prefix => Bound::Excluded(key.clone()),
            _ => Bound::Included(prefix.clone()),
        };
        let mut matching = objects
            .range::<String, _>((start, Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(&prefix));
        let contents: Vec<s3s::dto::Object> = matching
            .by_ref()
            .take(max_keys)
            .map(|(key, object)| s3s::dto::Object {
                key: Some(key.clone()),
                size: Some(object.body.len() as i64),
                e_tag: Some(object.etag()),
                last_modified: Some(object.last_modified.clone()),
                ..Default::default()
            })
            .collect();
        let is_truncated = matching.next().is_some();
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: input.prefix,
            max_keys: Some(max_keys as i32),
            key_count: Some(contents.len() as i32),
            continuation_token: input.continuation_token,
            start_after: input.start_after,
            is_truncated: Some(is_truncated),
            next_continuation_token: is_truncated
                .then(|| contents.last().and_then(|o| o.key.clone()))
                .flatten(),
            contents: Some(contents),
            ..Default::default()
        }))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let memory = Memory {
        latency: Duration::from_millis(args.latency_ms),
        ..Memory::default()
    };
    if let Some(root) = &args.preload {
        let started = Instant::now();
        let (count, bytes) = memory.preload(root)?;
        eprintln!(
            "s3-memory: preloaded {count} objects, {:.1} MiB from {} in {:.1} s",
            bytes as f64 / (1 << 20) as f64,
            root.display(),
            started.elapsed().as_secs_f64()
        );
    }
    let mut builder = S3ServiceBuilder::new(memory);
    builder.set_auth(SimpleAuth::from_single(args.access_key, args.secret_key));
    let service = builder.build();
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    eprintln!("s3-memory: listening on http://{}", listener.local_addr()?);
    let http = ConnBuilder::new(TokioExecutor::new());
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and the like: say so and keep serving the connections we have.
                eprintln!("s3-memory: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        // Small answers go out at once (no Nagle wait behind the client's delayed ACK).
        let _ = socket.set_nodelay(true);
        let connection = http
            .serve_connection(TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}

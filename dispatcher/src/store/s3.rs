//! S3 (and S3-compatible stores) through aws-sdk-s3.

use async_trait::async_trait;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ServerSideEncryption;
use bytes::{Bytes, BytesMut};

use super::{ListPage, ListedObject, ObjectMeta, ObjectStore, PutOutcome};
use crate::error::{DispatchError, ErrorClass, Result};
use crate::job::ObjectRef;

#[derive(Debug, Clone)]
pub struct S3Store {
    client: aws_sdk_s3::Client,
    /// When set, every write is SSE-KMS with this key (never silently unencrypted).
    sse_kms_key_id: Option<String>,
}

impl S3Store {
    pub fn new(client: aws_sdk_s3::Client, sse_kms_key_id: Option<String>) -> Self {
        Self {
            client,
            sse_kms_key_id,
        }
    }

    pub fn client(&self) -> &aws_sdk_s3::Client {
        &self.client
    }
}

/// HTTP status of a service error, if the request got that far.
fn status_of<E, R>(err: &SdkError<E, R>) -> Option<u16>
where
    R: HttpStatus,
{
    match err {
        SdkError::ServiceError(ctx) => Some(ctx.raw().status_code()),
        SdkError::ResponseError(ctx) => Some(ctx.raw().status_code()),
        _ => None,
    }
}

/// Lets `status_of` read the raw response's status without naming the SDK's internal type.
pub(crate) trait HttpStatus {
    fn status_code(&self) -> u16;
}

impl HttpStatus for aws_sdk_s3::config::http::HttpResponse {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

/// Transient: timeouts, connection failures, throttling, 5xx, 409 conflicts.
/// Infrastructure: credentials/permissions and other 4xx this node cannot fix.
pub(crate) fn class_of<E: ProvideErrorMetadata, R: HttpStatus>(err: &SdkError<E, R>) -> ErrorClass {
    match err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            ErrorClass::Transient
        }
        SdkError::ServiceError(ctx) => class_of_answer(
            ctx.raw().status_code(),
            ctx.err().code().unwrap_or_default(),
        ),
        _ => ErrorClass::Infrastructure,
    }
}

/// The class of an S3 or SQS error answer. Transient besides 5xx, 429 and 409: any throttling
/// (S3's `SlowDown`, SQS's `ThrottlingException`, KMS's `KMS.ThrottlingException` that S3
/// passes on for SSE-KMS writes, with a 400), a body that arrived damaged (`BadDigest`,
/// `InvalidDigest`, `XAmzContentSHA256Mismatch`, `IncompleteBody`: the checksum the SDK sends
/// caught it, and sending it again fixes it) and conflicts. Every other 4xx, such as
/// `AccessDenied` or `KMS.DisabledException`, is this node's infrastructure: the message is
/// released for later and the node stops taking work (and says so in its log and metrics).
fn class_of_answer(status: u16, code: &str) -> ErrorClass {
    let retry_fixes_it = code.contains("Throttl")
        || matches!(
            code,
            "SlowDown"
                | "RequestTimeout"
                | "ConditionalRequestConflict"
                | "OperationAborted"
                | "BadDigest"
                | "InvalidDigest"
                | "XAmzContentSHA256Mismatch"
                | "IncompleteBody"
        );
    if status >= 500 || status == 429 || status == 409 || retry_fixes_it {
        ErrorClass::Transient
    } else {
        ErrorClass::Infrastructure
    }
}

fn store_error<E, R>(bucket: &str, key: &str, op: &str, err: &SdkError<E, R>) -> DispatchError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: HttpStatus + std::fmt::Debug + 'static,
{
    let detail = match err {
        SdkError::ServiceError(ctx) => format!(
            "{} {}",
            ctx.err().code().unwrap_or("?"),
            ctx.err().message().unwrap_or_default()
        ),
        other => crate::aws::error_chain(other),
    };
    DispatchError::Store {
        bucket: bucket.to_owned(),
        key: key.to_owned(),
        class: class_of(err),
        message: format!("{op}: {detail}"),
    }
}

fn unquote(etag: Option<&str>) -> String {
    etag.unwrap_or_default().trim_matches('"').to_owned()
}

#[async_trait]
impl ObjectStore for S3Store {
    async fn head(&self, object: &ObjectRef) -> Result<Option<ObjectMeta>> {
        let result = self
            .client
            .head_object()
            .bucket(&object.bucket)
            .key(&object.key)
            .set_version_id(object.version_id.clone())
            .send()
            .await;
        match result {
            Ok(out) => Ok(Some(ObjectMeta {
                size_bytes: out.content_length().unwrap_or(0).max(0) as u64,
                etag: unquote(out.e_tag()),
                version_id: out.version_id().map(str::to_owned),
            })),
            // A HEAD of a missing version answers 400/404 depending on the implementation.
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) if object.version_id.is_some() && status_of(&e) == Some(400) => Ok(None),
            Err(e) => Err(store_error(&object.bucket, &object.key, "HeadObject", &e)),
        }
    }

    async fn get(
        &self,
        object: &ObjectRef,
        max_bytes: u64,
        if_etag: Option<&str>,
    ) -> Result<Bytes> {
        let result = self
            .client
            .get_object()
            .bucket(&object.bucket)
            .key(&object.key)
            .set_version_id(object.version_id.clone())
            .set_if_match(if_etag.map(|e| format!("\"{e}\"")))
            .send()
            .await;
        let out = match result {
            Ok(out) => out,
            Err(e) if status_of(&e) == Some(404) => {
                return Err(DispatchError::ObjectMissing {
                    bucket: object.bucket.clone(),
                    key: object.key.clone(),
                })
            }
            Err(e) if status_of(&e) == Some(412) => {
                return Err(DispatchError::Store {
                    bucket: object.bucket.clone(),
                    key: object.key.clone(),
                    class: ErrorClass::Transient,
                    message: "object changed between HEAD and GET".into(),
                })
            }
            Err(e) => return Err(store_error(&object.bucket, &object.key, "GetObject", &e)),
        };
        let too_large = |size_bytes| DispatchError::ObjectTooLarge {
            bucket: object.bucket.clone(),
            key: object.key.clone(),
            size_bytes,
            limit_bytes: max_bytes,
        };
        let declared = out.content_length().unwrap_or(0).max(0) as u64;
        if declared > max_bytes {
            return Err(too_large(declared));
        }
        let mut body = out.body;
        let mut bytes = BytesMut::with_capacity(declared as usize);
        loop {
            let chunk = body.try_next().await.map_err(|e| DispatchError::Store {
                bucket: object.bucket.clone(),
                key: object.key.clone(),
                class: ErrorClass::Transient,
                message: format!("reading body: {}", crate::aws::error_chain(&e)),
            })?;
            let Some(chunk) = chunk else { break };
            if (bytes.len() + chunk.len()) as u64 > max_bytes {
                return Err(too_large((bytes.len() + chunk.len()) as u64));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes.freeze())
    }

    async fn put_if_absent(
        &self,
        bucket: &str,
        key: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<PutOutcome> {
        let mut request = self
            .client
            .put_object()
            .bucket(bucket)
            .key(key)
            .content_type(content_type)
            .if_none_match("*")
            .body(ByteStream::from(body));
        if let Some(kms_key) = &self.sse_kms_key_id {
            request = request
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .ssekms_key_id(kms_key);
        }
        match request.send().await {
            Ok(_) => Ok(PutOutcome::Created),
            Err(e) if status_of(&e) == Some(412) => Ok(PutOutcome::AlreadyExists),
            Err(e) => Err(store_error(bucket, key, "PutObject", &e)),
        }
    }

    async fn list_page(
        &self,
        bucket: &str,
        prefix: &str,
        continuation: Option<String>,
    ) -> Result<ListPage> {
        let out = self
            .client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .set_continuation_token(continuation)
            .send()
            .await
            .map_err(|e| store_error(bucket, prefix, "ListObjectsV2", &e))?;
        let objects = out
            .contents()
            .iter()
            .filter_map(|o| {
                Some(ListedObject {
                    key: o.key()?.to_owned(),
                    size_bytes: o.size().unwrap_or(0).max(0) as u64,
                    etag: unquote(o.e_tag()),
                })
            })
            .collect();
        let next = if out.is_truncated().unwrap_or(false) {
            out.next_continuation_token().map(str::to_owned)
        } else {
            None
        };
        Ok(ListPage { objects, next })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_a_retry_fixes_are_transient_the_rest_stop_the_node() {
        for (status, code) in [
            (503, "SlowDown"),
            (500, "InternalError"),
            (400, "ThrottlingException"),
            (400, "KMS.ThrottlingException"),
            (400, "BadDigest"),
            (400, "XAmzContentSHA256Mismatch"),
            (409, "ConditionalRequestConflict"),
        ] {
            assert_eq!(
                class_of_answer(status, code),
                ErrorClass::Transient,
                "{code}"
            );
        }
        for (status, code) in [
            (403, "AccessDenied"),
            (400, "KMS.DisabledException"),
            (400, "KMS.NotFoundException"),
            (404, "NoSuchBucket"),
        ] {
            assert_eq!(
                class_of_answer(status, code),
                ErrorClass::Infrastructure,
                "{code}"
            );
        }
    }
}

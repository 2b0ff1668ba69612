//! Object stores: S3 (or anything that speaks it) and a local directory.

use std::future::Future;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{stream, StreamExt, TryStreamExt};

use crate::error::Result;
use crate::job::{ObjectRef, Prefix};

pub mod keys;
pub mod local;
pub mod s3;

/// What a HEAD (or a GET) tells us about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub size_bytes: u64,
    /// Entity tag without quotes; identifies the content of this version.
    pub etag: String,
    pub version_id: Option<String>,
}

/// Result of a create-only write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Created,
    /// Something already sits at that key (`412 Precondition Failed`): not overwritten.
    AlreadyExists,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedObject {
    pub key: String,
    pub size_bytes: u64,
    pub etag: String,
}

#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub objects: Vec<ListedObject>,
    /// Pass back to get the next page; `None` on the last page.
    pub next: Option<String>,
}

/// The operations the pipeline needs from an object store.
#[async_trait]
pub trait ObjectStore: Send + Sync {
    /// Metadata of the object (at its version, when given); `None` when it does not exist.
    async fn head(&self, object: &ObjectRef) -> Result<Option<ObjectMeta>>;

    /// The whole object, refused (`ObjectTooLarge`) above `max_bytes` before it is buffered.
    /// With `if_etag`, a GET of content other than that etag is a transient error.
    async fn get(&self, object: &ObjectRef, max_bytes: u64, if_etag: Option<&str>)
        -> Result<Bytes>;

    /// Creates `bucket/key` only if nothing is there (`If-None-Match: *`).
    async fn put_if_absent(
        &self,
        bucket: &str,
        key: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<PutOutcome>;

    /// One page (up to 1000 keys) of objects under `prefix`, in key order.
    async fn list_page(
        &self,
        bucket: &str,
        prefix: &str,
        continuation: Option<String>,
    ) -> Result<ListPage>;
}

/// Inputs of one listing page inspected at once (backfill, reconcile). Each inspection is a
/// request or two in a row; one input at a time, at 15 ms a request (S3's order for a HEAD),
/// held a backfill to 30 inputs a second, a tenth of what one GPU transcribes (measured against
/// scripts/bench/s3-memory --latency-ms 15); 64 at a time take a page of 1 000 in some 16
/// round trips.
pub const INPUTS_INSPECTED_AT_ONCE: usize = 64;

/// `inspect` of every input of a page, [`INPUTS_INSPECTED_AT_ONCE`] at a time; the answers in
/// the inputs' order, or the first error.
pub async fn inspect_at_once<'a, T, F, Fut>(
    inputs: impl IntoIterator<Item = &'a ListedObject>,
    inspect: F,
) -> Result<Vec<T>>
where
    F: FnMut(&'a ListedObject) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    stream::iter(inputs)
        .map(inspect)
        .buffered(INPUTS_INSPECTED_AT_ONCE)
        .try_collect()
        .await
}

/// The pages of a listing, one at a time (`backfill`, `reconcile`).
pub struct Pages<'a> {
    store: &'a dyn ObjectStore,
    prefix: &'a Prefix,
    /// `None` before the first page; `Some(None)` after the last.
    continuation: Option<Option<String>>,
}

impl<'a> Pages<'a> {
    pub fn new(store: &'a dyn ObjectStore, prefix: &'a Prefix) -> Self {
        Self {
            store,
            prefix,
            continuation: None,
        }
    }

    /// The next page's objects; `None` once the listing is done.
    pub async fn next(&mut self) -> Result<Option<Vec<ListedObject>>> {
        let continuation = match self.continuation.take() {
            Some(None) => {
                self.continuation = Some(None);
                return Ok(None);
            }
            Some(token) => token,
            None => None,
        };
        let page = self
            .store
            .list_page(&self.prefix.bucket, &self.prefix.prefix, continuation)
            .await?;
        self.continuation = Some(page.next);
        Ok(Some(page.objects))
    }
}

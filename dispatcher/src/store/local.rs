//! A directory that behaves like a bucket store: `root/<bucket>/<key segments>`.
//! Writes go to `root/.tmp/` first and are published with a hard link, which fails if the
//! target exists: the local equivalent of `If-None-Match: *`.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::keys::{check_bucket, object_path};
use super::{ListPage, ListedObject, ObjectMeta, ObjectStore, PutOutcome};
use crate::error::{DispatchError, ErrorClass, Result};
use crate::job::ObjectRef;

const LIST_PAGE_SIZE: usize = 1000;
/// Hashes kept at most (a few MiB); far more than the jobs in flight.
const ETAG_CACHE_MAX_ENTRIES: usize = 16_384;

#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
    page_size: usize,
    etags: EtagCache,
}

/// What identifies one version of a file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    inode: u64,
}

impl FileStamp {
    fn of(meta: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode: meta.ino(),
        }
    }
}

/// Content hashes already computed, valid while the file's stamp is unchanged: a job's `head`
/// and `get` then hash its input once between them, not twice (hashing was most of the local
/// store's CPU time per job).
#[derive(Debug, Clone, Default)]
struct EtagCache(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<PathBuf, (FileStamp, String)>>>,
);

impl EtagCache {
    fn get(&self, path: &Path, stamp: FileStamp) -> Option<String> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(path)
            .filter(|(s, _)| *s == stamp)
            .map(|(_, etag)| etag.clone())
    }

    fn put(&self, path: &Path, stamp: FileStamp, etag: &str) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Heads without a get (inputs whose result exists) are never forgotten: bound it.
        if map.len() >= ETAG_CACHE_MAX_ENTRIES {
            map.clear();
        }
        map.insert(path.to_owned(), (stamp, etag.to_owned()));
    }

    /// Forgets `path` once its job is done with it (the cache stays as small as the work in
    /// flight).
    fn forget(&self, path: &Path) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path);
    }
}

impl LocalStore {
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        let tmp = root.join(".tmp");
        fs::create_dir_all(&tmp).map_err(|e| DispatchError::io(&tmp, e))?;
        Ok(Self {
            root,
            page_size: LIST_PAGE_SIZE,
            etags: EtagCache::default(),
        })
    }

    /// Keys per listing page (S3's is 1000).
    pub fn with_page_size(mut self, page_size: usize) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes (or replaces) an object atomically; used to submit local input files. The object
    /// is a hard link to `from` where the file system allows (no copy, no new inode: the
    /// store's side of a local job is then just its result files), a copy elsewhere.
    pub fn put_replace(&self, bucket: &str, key: &str, from: &Path) -> Result<()> {
        let dest = object_path(&self.root, bucket, key)?;
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(|e| DispatchError::io(parent, e))?;
        }
        let tmp = self
            .root
            .join(".tmp")
            .join(uuid::Uuid::new_v4().to_string());
        if fs::hard_link(from, &tmp).is_err() {
            // Another file system, or one without hard links: copy.
            fs::copy(from, &tmp).map_err(|e| DispatchError::io(from, e))?;
        }
        fs::rename(&tmp, &dest).map_err(|e| DispatchError::io(&dest, e))?;
        // Renaming onto another link of the same file does nothing and leaves `tmp` (a file
        // submitted from inside the store's own inputs folder).
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(DispatchError::io(&tmp, e)),
            _ => Ok(()),
        }
    }

    /// Path of an object, for people (and tests) who want to look at results.
    pub fn path_of(&self, bucket: &str, key: &str) -> Result<PathBuf> {
        object_path(&self.root, bucket, key)
    }
}

fn no_versions(object: &ObjectRef) -> Result<()> {
    match &object.version_id {
        None => Ok(()),
        Some(_) => Err(DispatchError::Store {
            bucket: object.bucket.clone(),
            key: object.key.clone(),
            class: ErrorClass::Permanent,
            message: "the local store keeps no object versions".into(),
        }),
    }
}

/// Content hash, so that the same bytes always get the same result key.
fn etag_of_file(path: &Path) -> std::io::Result<String> {
    let mut file = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize())[..32].to_owned())
}

fn etag_of_bytes(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))[..32].to_owned()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DispatchError::Config(format!("blocking task failed: {e}")))?
}

#[async_trait]
impl ObjectStore for LocalStore {
    async fn head(&self, object: &ObjectRef) -> Result<Option<ObjectMeta>> {
        no_versions(object)?;
        let path = object_path(&self.root, &object.bucket, &object.key)?;
        let etags = self.etags.clone();
        blocking(move || match fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {
                let stamp = FileStamp::of(&meta);
                let etag = match etags.get(&path, stamp) {
                    Some(etag) => etag,
                    None => {
                        let etag = etag_of_file(&path).map_err(|e| DispatchError::io(&path, e))?;
                        etags.put(&path, stamp, &etag);
                        etag
                    }
                };
                Ok(Some(ObjectMeta {
                    size_bytes: meta.len(),
                    etag,
                    version_id: None,
                }))
            }
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(DispatchError::io(&path, e)),
        })
        .await
    }

    async fn get(
        &self,
        object: &ObjectRef,
        max_bytes: u64,
        if_etag: Option<&str>,
    ) -> Result<Bytes> {
        no_versions(object)?;
        let path = object_path(&self.root, &object.bucket, &object.key)?;
        let object = object.clone();
        let if_etag = if_etag.map(str::to_owned);
        let etags = self.etags.clone();
        blocking(move || {
            let missing = || DispatchError::ObjectMissing {
                bucket: object.bucket.clone(),
                key: object.key.clone(),
            };
            let file = match fs::File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing()),
                Err(e) => return Err(DispatchError::io(&path, e)),
            };
            let before = FileStamp::of(&file.metadata().map_err(|e| DispatchError::io(&path, e))?);
            let size_bytes = before.len;
            if size_bytes > max_bytes {
                return Err(DispatchError::ObjectTooLarge {
                    bucket: object.bucket.clone(),
                    key: object.key.clone(),
                    size_bytes,
                    limit_bytes: max_bytes,
                });
            }
            let mut bytes = Vec::with_capacity(size_bytes as usize);
            // `take` bounds the read even if the file grows after the size check.
            file.take(max_bytes)
                .read_to_end(&mut bytes)
                .map_err(|e| DispatchError::io(&path, e))?;
            if let Some(expected) = if_etag {
                // Unchanged since it was hashed (same stamp before and after this read): the
                // cached hash stands for these bytes.
                let after = fs::metadata(&path).map(|m| FileStamp::of(&m)).ok();
                let known = etags.get(&path, before);
                etags.forget(&path);
                let unchanged =
                    after == Some(before) && known.as_deref() == Some(expected.as_str());
                if !unchanged && etag_of_bytes(&bytes) != expected {
                    return Err(DispatchError::Store {
                        bucket: object.bucket,
                        key: object.key,
                        class: ErrorClass::Transient,
                        message: "object changed while it was being read".into(),
                    });
                }
            }
            Ok(Bytes::from(bytes))
        })
        .await
    }

    async fn put_if_absent(
        &self,
        bucket: &str,
        key: &str,
        body: Bytes,
        _content_type: &str,
    ) -> Result<PutOutcome> {
        let dest = object_path(&self.root, bucket, key)?;
        let tmp = self
            .root
            .join(".tmp")
            .join(uuid::Uuid::new_v4().to_string());
        blocking(move || {
            if let Some(parent) = dest.parent() {
                fs::create_dir_all(parent).map_err(|e| DispatchError::io(parent, e))?;
            }
            let mut file = fs::File::create(&tmp).map_err(|e| DispatchError::io(&tmp, e))?;
            file.write_all(&body)
                .and_then(|()| file.sync_all())
                .map_err(|e| DispatchError::io(&tmp, e))?;
            drop(file);
            let linked = fs::hard_link(&tmp, &dest);
            let _ = fs::remove_file(&tmp);
            match linked {
                Ok(()) => Ok(PutOutcome::Created),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    Ok(PutOutcome::AlreadyExists)
                }
                Err(e) => Err(DispatchError::io(&dest, e)),
            }
        })
        .await
    }

    async fn list_page(
        &self,
        bucket: &str,
        prefix: &str,
        continuation: Option<String>,
    ) -> Result<ListPage> {
        check_bucket(bucket)?;
        let bucket_dir = self.root.join(bucket);
        let prefix = prefix.to_owned();
        let page_size = self.page_size;
        blocking(move || {
            let mut keys = Vec::new();
            collect_keys(&bucket_dir, "", &mut keys)?;
            keys.retain(|k| {
                k.starts_with(&prefix)
                    && continuation
                        .as_deref()
                        .is_none_or(|after| k.as_str() > after)
            });
            keys.sort();
            let more = keys.len() > page_size;
            keys.truncate(page_size);
            let mut objects = Vec::with_capacity(keys.len());
            for key in keys {
                // Keys came from our own directory walk, one file-name segment at a time.
                let path = key.split('/').fold(bucket_dir.clone(), |p, s| p.join(s));
                let size_bytes = fs::metadata(&path)
                    .map_err(|e| DispatchError::io(&path, e))?
                    .len();
                let etag = etag_of_file(&path).map_err(|e| DispatchError::io(&path, e))?;
                objects.push(ListedObject {
                    key,
                    size_bytes,
                    etag,
                });
            }
            let next = if more {
                objects.last().map(|o| o.key.clone())
            } else {
                None
            };
            Ok(ListPage { objects, next })
        })
        .await
    }
}

/// Every file under `dir` as a `/`-joined key.
fn collect_keys(dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(DispatchError::io(dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| DispatchError::io(dir, e))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue; // not representable as a key
        };
        let key = format!("{prefix}{name}");
        let kind = entry
            .file_type()
            .map_err(|e| DispatchError::io(entry.path(), e))?;
        if kind.is_dir() {
            collect_keys(&entry.path(), &format!("{key}/"), out)?;
        } else if kind.is_file() {
            out.push(key);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn create_only_writes_and_capped_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::open(dir.path()).expect("open");
        let put = |body: &'static [u8]| {
            store.put_if_absent("bkt", "a/b c.txt", Bytes::from_static(body), "text/plain")
        };
        assert_eq!(put(b"first").await.expect("put"), PutOutcome::Created);
        assert_eq!(
            put(b"second").await.expect("put"),
            PutOutcome::AlreadyExists
        );
        let obj = ObjectRef::new("bkt", "a/b c.txt");
        assert_eq!(
            store.get(&obj, 100, None).await.expect("get"),
            Bytes::from_static(b"first")
        );
        let too_large = store.get(&obj, 3, None).await.expect_err("cap");
        assert_eq!(too_large.reason_code(), "file_too_large");
        let meta = store.head(&obj).await.expect("head").expect("exists");
        assert_eq!(meta.size_bytes, 5);
        assert!(store
            .get(&obj, 100, Some("other"))
            .await
            .expect_err("etag")
            .is_transient());
        assert!(store
            .head(&ObjectRef::new("bkt", "nope"))
            .await
            .expect("head")
            .is_none());
        let missing = store.get(&ObjectRef::new("bkt", "nope"), 10, None).await;
        assert_eq!(
            missing.expect_err("missing").reason_code(),
            "source_missing"
        );
        let escape = store.put_if_absent("bkt", "../x", Bytes::new(), "x").await;
        assert_eq!(escape.expect_err("escape").reason_code(), "unsafe_key");
    }

    #[test]
    fn submitted_inputs_are_linked_not_copied_and_leave_no_temporary_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::open(dir.path().join("store")).expect("open");
        let src = dir.path().join("in.wav");
        std::fs::write(&src, b"0123456789").expect("write");
        store.put_replace("inputs", "a.wav", &src).expect("submit");
        let path = store.path_of("inputs", "a.wav").expect("path");
        let ino = |p: &Path| std::fs::metadata(p).expect("metadata").ino();
        assert_eq!(
            ino(&path),
            ino(&src),
            "same file system: one inode, no copy"
        );
        // Submitted again from inside the store itself: still one object, nothing left over.
        store.put_replace("inputs", "a.wav", &path).expect("again");
        assert_eq!(std::fs::read(&path).expect("read"), b"0123456789");
        let left = std::fs::read_dir(dir.path().join("store/.tmp"))
            .expect("tmp")
            .count();
        assert_eq!(left, 0, "temporary names removed");
    }

    #[tokio::test]
    async fn a_remembered_hash_never_hides_a_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::open(dir.path()).expect("open");
        let src = dir.path().join("in.wav");
        std::fs::write(&src, b"0123456789").expect("write");
        store.put_replace("inputs", "a.wav", &src).expect("submit");
        let obj = ObjectRef::new("inputs", "a.wav");
        let meta = store.head(&obj).await.expect("head").expect("exists");
        assert_eq!(meta.etag, etag_of_bytes(b"0123456789"));
        // Unchanged: the hash from `head` stands, and the bytes come back.
        let got = store.get(&obj, 100, Some(&meta.etag)).await.expect("get");
        assert_eq!(got, Bytes::from_static(b"0123456789"));
        // Rewritten in place with the same length after `head`: the stamp changed, so `get`
        // hashes what it read and refuses it.
        let meta = store.head(&obj).await.expect("head").expect("exists");
        let path = store.path_of("inputs", "a.wav").expect("path");
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"9876543210").expect("rewrite");
        let changed = store.get(&obj, 100, Some(&meta.etag)).await;
        assert!(changed.expect_err("changed").is_transient());
        // And `head` sees the new content, not the remembered hash.
        let fresh = store.head(&obj).await.expect("head").expect("exists");
        assert_eq!(fresh.etag, etag_of_bytes(b"9876543210"));
    }

    #[tokio::test]
    async fn listing_pages_in_key_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::open(dir.path())
            .expect("open")
            .with_page_size(10);
        for i in 0..15 {
            let key = format!("p/{i:04}.wav");
            store
                .put_if_absent("bkt", &key, Bytes::from_static(b"x"), "x")
                .await
                .expect("put");
        }
        store
            .put_if_absent("bkt", "q/other", Bytes::new(), "x")
            .await
            .expect("put");
        let first = store.list_page("bkt", "p/", None).await.expect("list");
        assert_eq!(first.objects.len(), 10);
        let second = store
            .list_page("bkt", "p/", first.next.clone())
            .await
            .expect("list");
        assert_eq!(second.objects.len(), 5);
        assert!(second.next.is_none());
        assert_eq!(second.objects[4].key, "p/0014.wav");
    }
}

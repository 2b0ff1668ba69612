//! How the workers on one GPU find each other's weight arena: a directory in which every worker
//! holding an arena listens on `<key>.<pid>.sock` and sends the arena's file descriptor to
//! whoever connects. A file lock (`<key>.lock`) makes find-or-create atomic, so workers that
//! start together make one arena, and any surviving holder can serve a restarted worker.
//!
//! The key names what is shared: one model file (canonical path, size, modification time), one
//! device (UUID), one storage type and arena layout. A matching key is only a hint: an importer
//! still compares every byte with its own copy before it uses the arena.

use std::fs::File;
use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::device::CudaEngine;
use crate::error::{CudaEngineError, DriverContext, Result};
use crate::shared_memory::{receive_shared, send_shared, SharedDeviceMemory};

/// Bumped whenever the arena's layout (which weights, in what order, aligned how) changes.
const ARENA_LAYOUT_VERSION: u32 = 1;

/// A rendezvous directory and the key of one arena in it.
#[derive(Debug, Clone)]
pub struct WeightShare {
    dir: PathBuf,
    key: String,
}

impl WeightShare {
    /// The arena for `model` on `engine`'s device with weights stored as `storage` (e.g.
    /// "bf16"), found or published in `dir` (created if missing).
    pub fn for_model(dir: &Path, model: &Path, storage: &str, engine: &CudaEngine) -> Result<Self> {
        let io = |what: String| {
            move |source| CudaEngineError::Sharing {
                context: what,
                source,
            }
        };
        let canonical = model
            .canonicalize()
            .map_err(io(format!("resolving {}", model.display())))?;
        let meta = std::fs::metadata(&canonical)
            .map_err(io(format!("reading {}", canonical.display())))?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let uuid = engine
            .context()
            .uuid()
            .context(|| "reading the device UUID".into())?;
        let mut hash = Sha256::new();
        hash.update(canonical.as_os_str().as_encoded_bytes());
        hash.update(meta.len().to_le_bytes());
        hash.update(modified.to_le_bytes());
        hash.update(uuid.bytes.map(|b| b as u8));
        hash.update(storage.as_bytes());
        hash.update(ARENA_LAYOUT_VERSION.to_le_bytes());
        let digest = hash.finalize();
        let key: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        Self::new(dir, &key)
    }

    /// `key` is letters, digits, `-` and `_` only (it becomes part of file names).
    pub fn new(dir: &Path, key: &str) -> Result<Self> {
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(CudaEngineError::Shape {
                op: "WeightShare::new",
                detail: format!("key {key:?}: use letters, digits, '-' and '_'"),
            });
        }
        std::fs::create_dir_all(dir).map_err(|source| CudaEngineError::Sharing {
            context: format!("creating the weight-sharing directory {}", dir.display()),
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            key: key.to_string(),
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// Holds the key's lock until the returned file is dropped (blocks while another process
    /// holds it).
    pub(crate) fn lock(&self) -> Result<File> {
        let path = self.dir.join(format!("{}.lock", self.key));
        let file = File::create(&path).map_err(|source| CudaEngineError::Sharing {
            context: format!("opening {}", path.display()),
            source,
        })?;
        file.lock().map_err(|source| CudaEngineError::Sharing {
            context: format!("locking {}", path.display()),
            source,
        })?;
        Ok(file)
    }

    /// The sockets of this key's holders, oldest name first.
    fn holder_sockets(&self) -> Result<Vec<PathBuf>> {
        let prefix = format!("{}.", self.key);
        let entries = std::fs::read_dir(&self.dir).map_err(|source| CudaEngineError::Sharing {
            context: format!("listing {}", self.dir.display()),
            source,
        })?;
        let mut sockets: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".sock"))
            })
            .collect();
        sockets.sort();
        Ok(sockets)
    }

    /// Maps the arena of the first holder that answers. Sockets nobody listens on any more
    /// (their worker exited) are removed. Call with [`Self::lock`] held.
    pub(crate) fn find(&self, engine: &CudaEngine) -> Result<Option<SharedDeviceMemory>> {
        let own = format!("{}.{}.sock", self.key, std::process::id());
        for socket in self.holder_sockets()? {
            // A process never maps its own arena a second time.
            if socket
                .file_name()
                .is_some_and(|n| n.to_str() == Some(own.as_str()))
            {
                continue;
            }
            let Some(stream) = connect_or_remove(&socket) else {
                continue;
            };
            match receive_shared(engine, stream.as_fd()) {
                Ok(memory) => return Ok(Some(memory)),
                // A holder that fails mid-way is skipped; the next one may answer.
                Err(CudaEngineError::Sharing { .. }) => continue,
                Err(other) => return Err(other),
            }
        }
        Ok(None)
    }

    /// Publishes `arena` under this key until the returned server is dropped. Call with
    /// [`Self::lock`] held.
    pub(crate) fn serve(&self, arena: Arc<SharedDeviceMemory>) -> Result<ShareServer> {
        let path = self
            .dir
            .join(format!("{}.{}.sock", self.key, std::process::id()));
        let _ = std::fs::remove_file(&path); // a previous process with our pid
        let listener = UnixListener::bind(&path).map_err(|source| CudaEngineError::Sharing {
            context: format!("listening on {}", path.display()),
            source,
        })?;
        let waker = listener
            .try_clone()
            .map_err(|source| CudaEngineError::Sharing {
                context: "duplicating the weight-sharing socket".into(),
                source,
            })?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("weight-share".into())
                .spawn(move || {
                    for stream in listener.incoming() {
                        if stop.load(Ordering::Acquire) {
                            break;
                        }
                        // A client that hangs up early only loses its own request.
                        if let Ok(stream) = stream {
                            let _ = send_shared(stream.as_fd(), &arena);
                        }
                    }
                })
                .map_err(|source| CudaEngineError::Sharing {
                    context: "starting the weight-sharing thread".into(),
                    source,
                })?
        };
        Ok(ShareServer {
            path,
            waker,
            stop,
            thread: Some(thread),
        })
    }
}

/// A connection to a holder's socket; `None` if it does not answer. A socket that refuses (its
/// process exited without removing it) is deleted.
fn connect_or_remove(socket: &Path) -> Option<UnixStream> {
    match UnixStream::connect(socket) {
        Ok(stream) => Some(stream),
        Err(e) => {
            if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::NotFound) {
                let _ = std::fs::remove_file(socket);
            }
            None
        }
    }
}

/// A published arena: its socket and the thread that answers on it.
pub struct ShareServer {
    path: PathBuf,
    /// The listening socket again, to wake the accept loop even when the path is gone.
    waker: UnixListener,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ShareServer {
    pub fn socket(&self) -> &Path {
        &self.path
    }
}

impl Drop for ShareServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop: shutting the listening socket down makes a blocked accept
        // fail; connecting also works while the path exists.
        let _ = rustix::net::shutdown(&self.waker, rustix::net::Shutdown::Both);
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
        // Never hang a shutdown on it: a thread still blocked after a second is left behind.
        if let Some(thread) = self.thread.take() {
            let deadline = Instant::now() + Duration::from_secs(1);
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_must_be_file_name_safe() {
        let dir = std::env::temp_dir().join(format!("weight-share-keys-{}", std::process::id()));
        assert!(WeightShare::new(&dir, "abc-123_x").is_ok());
        for bad in ["", "a/b", "../x", "a.b", "a b"] {
            assert!(WeightShare::new(&dir, bad).is_err(), "{bad:?} accepted");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn stale_sockets_are_removed_and_live_ones_listed() {
        let dir = std::env::temp_dir().join(format!("weight-share-stale-{}", std::process::id()));
        let share = WeightShare::new(&dir, "k").expect("share");
        let stale = dir.join("k.1.sock");
        drop(UnixListener::bind(&stale).expect("bind")); // bound, then nobody listens
        let other_key = dir.join("other.2.sock");
        let _live = UnixListener::bind(&other_key).expect("bind");
        assert_eq!(share.holder_sockets().expect("list"), vec![stale.clone()]);
        assert!(connect_or_remove(&stale).is_none());
        assert!(!stale.exists(), "the stale socket is still there");
        assert!(connect_or_remove(&other_key).is_some());
        assert!(other_key.exists());
        let _lock = share.lock().expect("lock");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

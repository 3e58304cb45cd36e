//! The result store: where validated result bytes are kept, with their size and sha256 recorded on
//! the operation. History never holds the bytes.
//!
//! * **In the database** (the default): the bytes ride on the step that records them and are
//!   inserted by the same transaction (`operation_results`), so a recorded location always has its
//!   bytes, no result needs an fsync of its own, and any host can read it back.
//! * **In a directory**: content-addressed files under a local root, each fsynced (with its
//!   directory) before the step that records it is written. Only the host that wrote a file can
//!   read it.

use jobtrail_core::OperationId;
use jobtrail_store::{ResultBytes, Store};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Where result bytes go.
#[derive(Debug, Clone)]
pub enum ResultStore {
    Database,
    Directory(ResultDir),
}

/// A local result directory.
#[derive(Debug, Clone)]
pub struct ResultDir {
    /// Absolute (locations recorded in the database must not depend on a working directory).
    root: PathBuf,
}

/// What was kept, and where. `bytes`: still to be written by the step that records `location`
/// (database store), which carries them in [`jobtrail_store::Step::result_bytes`].
pub type Stored = jobtrail_core::decide::Kept;

impl ResultStore {
    /// Keep results in a local directory.
    pub fn directory(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let root = std::path::absolute(&root).unwrap_or(root);
        Self::Directory(ResultDir { root })
    }

    /// Keep `bytes` of `operation`. In the database nothing is written yet: the returned
    /// [`Stored::bytes`] go with the step. In a directory the file is durable when this returns
    /// (written off the async threads).
    pub async fn keep(
        &self,
        operation: OperationId,
        bytes: bytes::Bytes,
        content_type: Option<String>,
    ) -> std::io::Result<Stored> {
        match self {
            Self::Database => {
                if bytes.len() > MAX_DATABASE_RESULT {
                    return Err(std::io::Error::other(format!(
                        "a {} byte result is more than the database result store takes ({} bytes): run workers with --result-dir",
                        bytes.len(),
                        MAX_DATABASE_RESULT
                    )));
                }
                let (sha256, bytes) = sha256_hex(bytes).await.map_err(std::io::Error::other)?;
                let r = ResultBytes {
                    sha256,
                    content_type,
                    bytes,
                };
                Ok(Stored {
                    location: r.location(operation),
                    size: r.bytes.len() as u64,
                    sha256: r.sha256.clone(),
                    bytes: Some(r),
                })
            }
            Self::Directory(dir) => {
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || dir.put(&operation.to_string(), &bytes))
                    .await
                    .map_err(std::io::Error::other)?
            }
        }
    }

    /// Read a kept result back, wherever it is, and check it against the recorded digest.
    pub async fn read_verified(
        store: &Store,
        location: &str,
        sha256: &str,
    ) -> Result<Vec<u8>, ReadError> {
        let bytes = if let Some((op, sha)) = ResultBytes::parse_location(location) {
            store
                .result_bytes(op, sha)
                .await
                .map_err(ReadError::Database)?
                .ok_or_else(|| {
                    ReadError::Missing(format!("{location}: no such result in the database"))
                })?
        } else {
            let location = location.to_owned();
            tokio::task::spawn_blocking(move || ResultDir::read(&location))
                .await
                .map_err(|e| ReadError::Missing(e.to_string()))?
                .map_err(ReadError::Missing)?
        };
        let (got, bytes) = sha256_hex(bytes::Bytes::from(bytes))
            .await
            .map_err(ReadError::Altered)?;
        check_digest(location, &got, sha256).map_err(ReadError::Altered)?;
        Ok(Vec::from(bytes))
    }
}

/// The largest result kept in the database: far below PostgreSQL's 1 GB limit for one value, and
/// more than any contract here allows (`result.max_bytes`).
pub const MAX_DATABASE_RESULT: usize = 256 << 20;

/// Why a kept result could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The database could not be asked (it may be back soon): not a fact about the result.
    #[error("reading the result: {0}")]
    Database(jobtrail_store::StoreError),
    /// Nothing is kept where the record points.
    #[error("{0}")]
    Missing(String),
    /// The bytes are there but are not the ones recorded.
    #[error("{0}")]
    Altered(String),
}

/// Bytes from which hashing or checking them is taken off the runtime's threads (the provider's
/// answers and the worker's results alike).
pub(crate) use jobtrail_provider::wire::BLOCKING_BYTES;

/// The lowercase hex sha256 of `bytes` (and the bytes back), computed on a blocking thread when
/// they are large enough to stall the async threads.
async fn sha256_hex(bytes: bytes::Bytes) -> Result<(String, bytes::Bytes), String> {
    let digest = |b: bytes::Bytes| (hex::encode(Sha256::digest(&b)), b);
    if bytes.len() < BLOCKING_BYTES {
        return Ok(digest(bytes));
    }
    tokio::task::spawn_blocking(move || digest(bytes))
        .await
        .map_err(|e| e.to_string())
}

/// Whether `got`, the digest of what `location` holds, is the recorded one.
fn check_digest(location: &str, got: &str, sha256: &str) -> Result<(), String> {
    if got != sha256 {
        return Err(format!(
            "{location}: sha256 is {got}, the record says {sha256}: the stored result was altered"
        ));
    }
    Ok(())
}

impl ResultDir {
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether results can be kept here: the directory made if missing, and a file written,
    /// synced and removed in it. Checked at start, so a read-only mount, a plain file or a
    /// directory without permission is refused then, not found out one finished job at a time.
    pub fn check(&self) -> std::io::Result<()> {
        use std::io::Write;
        std::fs::create_dir_all(&self.root)?;
        // A name of its own: workers started together on a shared directory (each PID 1 in its
        // container) must not remove each other's probe.
        let probe = self
            .root
            .join(format!(".jobtrail-probe.{}", uuid::Uuid::now_v7().simple()));
        let written = std::fs::File::create(&probe).and_then(|mut f| {
            f.write_all(b"probe")?;
            f.sync_all()
        });
        let removed = std::fs::remove_file(&probe);
        written.and(removed)
    }

    /// Write `bytes` for `operation`, durably, at `<root>/<shard>/<operation>.<sha256>` (the shard is
    /// the id's last two characters, so no directory grows without bound and none is made per
    /// operation). The file is fsynced, and so is its directory (the new name must survive a crash
    /// too), before this returns: only then may the database record the location. Idempotent: the
    /// same bytes land at the same path; a file left torn by a crash is noticed by its digest and
    /// replaced.
    pub fn put(&self, operation: &str, bytes: &[u8]) -> std::io::Result<Stored> {
        use std::io::Write;
        let sha = hex::encode(Sha256::digest(bytes));
        let shard = operation
            .get(operation.len().saturating_sub(2)..)
            .filter(|s| s.len() == 2 && s.chars().all(|c| c.is_ascii_alphanumeric()))
            .unwrap_or("__");
        let dir = self.root.join(shard);
        let path = dir.join(format!("{operation}.{sha}"));
        let created = match Self::create_new(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(&dir)?;
                sync_dir(&self.root)?;
                Self::create_new(&path)
            }
            other => other,
        };
        match created {
            Ok(mut f) => {
                f.write_all(bytes)?;
                f.sync_all()?;
                sync_dir(&dir)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let intact = std::fs::read(&path)
                    .map(|old| hex::encode(Sha256::digest(&old)) == sha)
                    .unwrap_or(false);
                if !intact {
                    // Torn by a crash mid-write: replace it whole (temp file, fsync, rename).
                    let tmp = dir.join(format!(".{operation}.{sha}.{}.tmp", std::process::id()));
                    let mut f = std::fs::File::create(&tmp)?;
                    f.write_all(bytes)?;
                    f.sync_all()?;
                    std::fs::rename(&tmp, &path)?;
                    sync_dir(&dir)?;
                }
            }
            Err(e) => return Err(e),
        }
        Ok(Stored {
            location: format!("file://{}", path.display()),
            size: bytes.len() as u64,
            sha256: sha,
            bytes: None,
        })
    }

    /// The bytes of a `file://` location (on this host).
    fn read(location: &str) -> Result<Vec<u8>, String> {
        let path = location
            .strip_prefix("file://")
            .ok_or_else(|| format!("unsupported result location {location:?}"))?;
        std::fs::read(path).map_err(|e| format!("{path}: {e}"))
    }

    fn create_new(path: &Path) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
    }
}

/// Make a directory's entries durable (a new or renamed file's name).
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_verified(location: &str, sha256: &str) -> Result<Vec<u8>, String> {
        let bytes = ResultDir::read(location)?;
        check_digest(location, &hex::encode(Sha256::digest(&bytes)), sha256)?;
        Ok(bytes)
    }

    fn dir(root: impl Into<PathBuf>) -> ResultDir {
        match ResultStore::directory(root) {
            ResultStore::Directory(d) => d,
            ResultStore::Database => unreachable!(),
        }
    }

    #[test]
    fn put_is_durable_idempotent_and_repairs_a_torn_file() {
        let tmp = tempfile::tempdir().unwrap();
        let store = dir(tmp.path());
        let a = store.put("op_01ABCXY", b"hello").unwrap();
        assert_eq!(a.size, 5);
        let path = a.location.strip_prefix("file://").unwrap().to_owned();
        assert!(path.starts_with(tmp.path().to_str().unwrap()));
        assert!(path.contains("/XY/op_01ABCXY."), "{path}");
        assert_eq!(read_verified(&a.location, &a.sha256).unwrap(), b"hello");
        // The same bytes again: the same place, nothing rewritten.
        assert_eq!(store.put("op_01ABCXY", b"hello").unwrap(), a);
        // A torn file (a crash mid-write) is replaced whole.
        std::fs::write(&path, b"hel").unwrap();
        assert!(read_verified(&a.location, &a.sha256).is_err());
        assert_eq!(store.put("op_01ABCXY", b"hello").unwrap(), a);
        assert_eq!(read_verified(&a.location, &a.sha256).unwrap(), b"hello");
        // Different bytes for the same operation: a different file, the first one kept.
        let b = store.put("op_01ABCXY", b"other").unwrap();
        assert_ne!(a.location, b.location);
        assert!(std::path::Path::new(&path).exists());
    }

    #[test]
    fn a_relative_root_is_recorded_absolute() {
        let store = dir("some/relative/dir");
        assert!(store.root().is_absolute());
    }
}

//! The result store: validated result bytes on disk (a local directory by default), content-addressed
//! per operation. The operation record keeps the location, size and sha256; history never holds the
//! bytes.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Where result bytes go.
#[derive(Debug, Clone)]
pub struct ResultStore {
    /// Absolute (locations recorded in the database must not depend on a working directory).
    root: PathBuf,
}

/// What was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub location: String,
    pub size: u64,
    pub sha256: String,
}

impl ResultStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let root = std::path::absolute(&root).unwrap_or(root);
        Self { root }
    }
    /// The default: `$JOBTRAIL_RESULT_DIR`, else `results/` under the user's data directory.
    pub fn default_root() -> PathBuf {
        if let Some(d) = std::env::var_os("JOBTRAIL_RESULT_DIR").filter(|d| !d.is_empty()) {
            return PathBuf::from(d);
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return PathBuf::from("/var/lib/jobtrail/results");
        }
        let base = std::env::var_os("XDG_DATA_HOME")
            .filter(|x| !x.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
            .unwrap_or_else(std::env::temp_dir);
        base.join("jobtrail/results")
    }

    pub fn root(&self) -> &Path {
        &self.root
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
        })
    }

    fn create_new(path: &Path) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
    }

    /// [`ResultStore::put`] off the async threads (it writes and fsyncs a file).
    pub async fn put_blocking(
        &self,
        operation: String,
        bytes: bytes::Bytes,
    ) -> std::io::Result<Stored> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.put(&operation, &bytes))
            .await
            .map_err(std::io::Error::other)?
    }

    /// Read a stored result back and check it against the recorded digest.
    pub fn get_verified(location: &str, sha256: &str) -> Result<Vec<u8>, String> {
        let path = location
            .strip_prefix("file://")
            .ok_or_else(|| format!("unsupported result location {location:?}"))?;
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        let got = hex::encode(Sha256::digest(&bytes));
        if got != sha256 {
            return Err(format!(
                "{path}: sha256 is {got}, the record says {sha256}: the stored result was altered"
            ));
        }
        Ok(bytes)
    }
}

/// Make a directory's entries durable (a new or renamed file's name).
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_is_durable_idempotent_and_repairs_a_torn_file() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ResultStore::new(tmp.path());
        let a = store.put("op_01ABCXY", b"hello").unwrap();
        assert_eq!(a.size, 5);
        let path = a.location.strip_prefix("file://").unwrap().to_owned();
        assert!(path.starts_with(tmp.path().to_str().unwrap()));
        assert!(path.contains("/XY/op_01ABCXY."), "{path}");
        assert_eq!(
            ResultStore::get_verified(&a.location, &a.sha256).unwrap(),
            b"hello"
        );
        // The same bytes again: the same place, nothing rewritten.
        assert_eq!(store.put("op_01ABCXY", b"hello").unwrap(), a);
        // A torn file (a crash mid-write) is replaced whole.
        std::fs::write(&path, b"hel").unwrap();
        assert!(ResultStore::get_verified(&a.location, &a.sha256).is_err());
        assert_eq!(store.put("op_01ABCXY", b"hello").unwrap(), a);
        assert_eq!(
            ResultStore::get_verified(&a.location, &a.sha256).unwrap(),
            b"hello"
        );
        // Different bytes for the same operation: a different file, the first one kept.
        let b = store.put("op_01ABCXY", b"other").unwrap();
        assert_ne!(a.location, b.location);
        assert!(std::path::Path::new(&path).exists());
    }

    #[test]
    fn a_relative_root_is_recorded_absolute() {
        let store = ResultStore::new("some/relative/dir");
        assert!(store.root().is_absolute());
    }
}

//! The memory a worker gives to checking results at once.
//!
//! A JSON result is parsed whole to be checked (schema, counts, items), and parsed it takes from
//! about its own size to some thirty times it (a list of small numbers, or of small objects, each
//! a B-tree node). Many large results arriving together could take a worker's memory many times
//! over, and a worker killed for memory records nothing: the next one to claim the operation is
//! handed the same result. So a large JSON result's parse is first measured without building it
//! (`json::footprint_within`), and the check waits for that much of the room. One that would take
//! more than the whole room is never parsed: it is held for a person (`result_stalled`).
//!
//! A result's bytes are held too, from its fetch until its step is written (a worker's 64 slots
//! each fetching a 16 MiB result would hold 1 GiB before any parse): each fetch first takes the
//! most its contract lets it be (the whole of a second room at most: such a result is fetched
//! alone) and gives back what it did not need once it has arrived. An answer that may carry the
//! result (a status answer where the final status is the result, a create answer that may be the
//! finished job) is read to the result's limit, so its call takes that much of the same room while
//! its answer is read.

use jobtrail_core::json::footprint_within;
use tokio::sync::{Semaphore, SemaphorePermit};

/// Room for parsed results, counted in KiB.
pub(crate) struct CheckRoom {
    room: Semaphore,
    kib: u32,
}

/// What a check may take.
pub(crate) enum Room<'a> {
    /// This much of the room, given back when dropped.
    Taken(Option<SemaphorePermit<'a>>),
    /// More than the whole room: never parsed here.
    Beyond,
}

impl CheckRoom {
    /// A room of `bytes` (at least 1 MiB).
    pub(crate) fn new(bytes: u64) -> Self {
        let kib = u32::try_from(bytes / 1024).unwrap_or(u32::MAX).max(1024);
        Self {
            room: Semaphore::new(kib as usize),
            kib,
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        u64::from(self.kib) * 1024
    }

    /// Measure what parsing `text` takes (CPU in proportion to its size: call it off the async
    /// threads for large texts), in KiB; `None` when it is more than the whole room.
    pub(crate) fn measure(&self, text: &[u8]) -> Option<u32> {
        let most = self.kib as usize * 1024;
        let need = match footprint_within(text, most) {
            Ok(n) => n,
            Err(e) if e.too_large => return None,
            // Not JSON after all: the check's parse stops where the walk did, within the room,
            // having built as much as the walk counted; that is at most all of it.
            Err(_) => most,
        };
        Some(u32::try_from(need.div_ceil(1024)).map_or(self.kib, |k| k.clamp(1, self.kib)))
    }

    /// Wait for room for `bytes` held as they are (a result's bytes in flight), at most the whole
    /// room: one larger than it is still taken in, alone.
    pub(crate) async fn take_bytes(&self, bytes: u64) -> Option<SemaphorePermit<'_>> {
        self.room
            .acquire_many(kib_of(bytes).min(self.kib))
            .await
            .ok()
    }

    /// Wait for `kib` of the room (as [`CheckRoom::measure`] gave it).
    pub(crate) async fn take(&self, kib: Option<u32>) -> Room<'_> {
        match kib {
            // The semaphore is never closed: a failed acquire cannot happen, and would only skip
            // the bound.
            Some(k) => Room::Taken(self.room.acquire_many(k).await.ok()),
            None => Room::Beyond,
        }
    }
}

/// What `bytes` take of a room, in whole KiB (at least 1).
fn kib_of(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Give back what `held` has beyond `bytes` (a result found smaller than the room taken for it).
pub(crate) fn keep_only(held: &mut SemaphorePermit<'_>, bytes: u64) {
    let beyond = (held.num_permits() as u64).saturating_sub(u64::from(kib_of(bytes)));
    drop(held.split(beyond as usize));
}

/// Half the memory the process may use (the tightest memory limit on its cgroup and the cgroups
/// above it: a container's memory limit, a systemd unit's `MemoryMax`), else 1 GiB: the default
/// room when no `--check-mib` is given.
pub fn default_check_bytes() -> u64 {
    memory_limit(&|path| std::fs::read_to_string(path).ok()).map_or(1 << 30, |limit| limit / 2)
}

/// The tightest memory limit on the cgroup `/proc/self/cgroup` names and on each above it: cgroup
/// v2's `memory.max` under `/sys/fs/cgroup`, else v1's `memory.limit_in_bytes` under
/// `/sys/fs/cgroup/memory`. Reading only the mount's root would miss a limit set below it (a host
/// cgroup namespace, a systemd unit); a level whose file is missing is skipped (the kernel names
/// a v1 container's cgroup by its host path, which its own mount does not have). `read`: the
/// file system, or a test's.
fn memory_limit(read: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    let cgroups = read("/proc/self/cgroup").unwrap_or_default();
    let v2 = cgroups.lines().find_map(|l| l.strip_prefix("0::"));
    let v1 = cgroups.lines().find_map(|l| {
        let mut fields = l.splitn(3, ':').skip(1);
        let (controllers, path) = (fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    });
    for (path, root, file) in [
        (v2, "/sys/fs/cgroup", "memory.max"),
        (v1, "/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
    ] {
        let Some(path) = path else { continue };
        let mut dir = path.trim().trim_end_matches('/').to_owned();
        let (mut read_any, mut tightest) = (false, None::<u64>);
        loop {
            if let Some(text) = read(&format!("{root}{dir}/{file}")) {
                read_any = true;
                if let Some(limit) = limit_of(&text) {
                    tightest = Some(tightest.map_or(limit, |t| t.min(limit)));
                }
            }
            if dir.is_empty() {
                break;
            }
            dir.truncate(dir.rfind('/').unwrap_or(0));
        }
        if read_any {
            return tightest;
        }
    }
    None
}

/// A cgroup file's memory limit; `None` where it sets none (v2 says `max`, v1 a number near 2^63).
fn limit_of(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|l| *l < 1 << 50)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A parse that would take more than the room is refused before anything is built; one that
    /// fits is measured at what serde_json builds for it; a text that is no JSON takes the whole
    /// room; checks wait for room and never hold more than it between them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn checks_take_what_their_parse_needs_and_never_more_than_the_room() {
        let room = Arc::new(CheckRoom::new(4 << 20));
        assert_eq!(room.bytes(), 4 << 20);
        // 1 MiB of `[0,0,…]`: half a million values of 32 bytes each, 16 MiB parsed.
        let zeros = |n: usize| format!("[{}0]", "0,".repeat(n));
        assert_eq!(room.measure(zeros(512 * 1024).as_bytes()), None);
        assert!(matches!(room.take(None).await, Room::Beyond));
        // 64 KiB of it: 32 769 values, 1 MiB, and the list's spare capacity (it doubles: 2 MiB).
        let need = room.measure(zeros(32 * 1024).as_bytes()).unwrap();
        assert!((1024..=2049).contains(&need), "{need} KiB");
        assert_eq!(
            room.measure(b"{\"not\": json"),
            Some(4096),
            "no JSON: all of it"
        );
        assert_eq!(room.measure(b"[]"), Some(1));

        static HELD: AtomicU32 = AtomicU32::new(0);
        static MOST: AtomicU32 = AtomicU32::new(0);
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let room = room.clone();
                tokio::spawn(async move {
                    let _taken = room.take(Some(1536)).await;
                    let now = HELD.fetch_add(1536, Ordering::SeqCst) + 1536;
                    MOST.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    HELD.fetch_sub(1536, Ordering::SeqCst);
                })
            })
            .collect();
        for t in tasks {
            tokio::time::timeout(std::time::Duration::from_secs(10), t)
                .await
                .expect("bounded")
                .unwrap();
        }
        let most = MOST.load(Ordering::SeqCst);
        assert!(
            (1536..=2 * 1536).contains(&most),
            "{most} KiB at once in 4 MiB"
        );
    }

    /// A result's bytes take the most their contract allows, the whole room at most, and give
    /// back what they did not need once they have arrived.
    #[tokio::test]
    async fn bytes_take_their_most_then_only_what_came() {
        let room = CheckRoom::new(4 << 20);
        let free = || room.room.available_permits();
        let mut held = room.take_bytes(16 << 20).await.expect("the whole room");
        assert_eq!(
            free(),
            0,
            "a result allowed more than the room is fetched alone"
        );
        keep_only(&mut held, 100 * 1024 + 1);
        assert_eq!(free(), 4096 - 101);
        keep_only(&mut held, 0);
        assert_eq!(free(), 4095, "an empty result still counts 1 KiB");
        drop(held);
        assert_eq!(free(), 4096);
        let _one = room.take_bytes(1 << 20).await.unwrap();
        let _two = room.take_bytes(3 << 20).await.unwrap();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), room.take_bytes(1))
                .await
                .is_err(),
            "a full room makes the next fetch wait"
        );
    }

    /// The default room is half the tightest memory limit on the process's cgroup or any above
    /// it (cgroup v2, else v1), read where `/proc/self/cgroup` says; 1 GiB where none is set.
    #[test]
    fn the_default_room_is_half_the_tightest_limit_above_the_process() {
        let limit = |files: &[(&str, &str)]| {
            let files: std::collections::HashMap<String, String> = files
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            memory_limit(&|p| files.get(p).cloned())
        };
        // A container with its own cgroup namespace: the root of its mount.
        let container = [
            ("/proc/self/cgroup", "0::/\n"),
            ("/sys/fs/cgroup/memory.max", "536870912\n"),
        ];
        assert_eq!(limit(&container), Some(512 << 20));
        // A host namespace, or a systemd unit's MemoryMax: set below the root.
        let unit = [
            ("/proc/self/cgroup", "0::/system.slice/jobtrail.service\n"),
            ("/sys/fs/cgroup/memory.max", "max\n"),
            ("/sys/fs/cgroup/system.slice/memory.max", "max\n"),
            (
                "/sys/fs/cgroup/system.slice/jobtrail.service/memory.max",
                "1073741824\n",
            ),
        ];
        assert_eq!(limit(&unit), Some(1 << 30));
        // A tighter limit above wins.
        let slice = [
            ("/proc/self/cgroup", "0::/kubepods/pod1/c1\n"),
            ("/sys/fs/cgroup/kubepods/pod1/memory.max", "268435456\n"),
            ("/sys/fs/cgroup/kubepods/pod1/c1/memory.max", "max\n"),
        ];
        assert_eq!(limit(&slice), Some(256 << 20));
        // v1 (beside an empty v2 hierarchy), named by a host path its mount lacks: the levels
        // there are read.
        let v1 = [
            (
                "/proc/self/cgroup",
                "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
            ),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "134217728\n"),
        ];
        assert_eq!(limit(&v1), Some(128 << 20));
        let v1_unlimited = [
            ("/proc/self/cgroup", "4:memory:/\n"),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ];
        assert_eq!(limit(&v1_unlimited), None);
        assert_eq!(limit(&[]), None);
        assert_eq!(limit(&[("/proc/self/cgroup", "garbage")]), None);
        // This machine's own answer, whatever it is, is a room of at least something.
        assert!(default_check_bytes() > 0);
    }
}

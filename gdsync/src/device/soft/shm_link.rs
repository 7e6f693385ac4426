//! Links between processes on one host: the shared-memory file a link's rings live in, its
//! set-up by the two ends, and the sweep of files whose creator died.

use super::link::{process_gone, Liveness, PEER_WAIT};
use super::ring::{Mapping, RING_BYTES};
use super::Link;
use crate::shm::SharedMemory;
use crate::{Error, Result};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shared-memory file's header (in the mapping's first page): the magic, the ring size
/// (u32), then the creator's pid and namespace.
const SEG_MAGIC: u64 = u64::from_le_bytes(*b"GDSLINK1");
const OFF_MAGIC: usize = 0;
const OFF_CAP: usize = 8;
/// The creator's pid (u32): whoever finds the file after its creator died may remove it.
const OFF_CREATOR: usize = 12;
/// The creator's PID namespace (the inode of `/proc/self/ns/pid`, u64): its pid means
/// something only to processes of the same namespace (containers may share `/dev/shm` and
/// not their pids).
const OFF_PIDNS: usize = 16;
/// Where the files of links between processes live (in a directory of each user's own,
/// `gdsync-<uid>`, that no one else may enter), and how their names start.
const SHM_DIR: &str = "/dev/shm";
const SHM_USER_DIR: &str = "gdsync";
const SHM_PREFIX: &str = "gdsync-link-";

impl Link {
    /// A link to device `peer` of process `pid` on this host, through a shared-memory file.
    /// The device with the smaller uid creates the file; the other opens it (waiting for it
    /// up to 30 s) and unlinks it once mapped.
    pub(crate) fn shared_memory(me: u64, peer: u64, pid: u32) -> Result<Self> {
        let (lo, hi) = (me.min(peer), me.max(peer));
        let dir = link_dir()?;
        let path = dir.join(format!("{SHM_PREFIX}{lo:016x}-{hi:016x}"));
        let size = Mapping::size_for(2);
        let creator = me < peer;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        // SAFETY: a nonnegative return is a new fd we own.
        let pidfd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) });
        // While waiting for the peer's half: a peer that died during set-up ends the wait.
        let peer_gone = |what: &str| {
            process_gone(pid, pidfd.as_ref()).then(|| {
                Error::Unreachable(format!(
                    "peer device {peer:016x}: its process {pid} exited before it {what} {}",
                    path.display()
                ))
            })
        };
        let map = if creator {
            // What a crashed process left is found by the next link made by any process of
            // this user (a look at a directory of this user's link files only).
            sweep_orphaned_links(&dir);
            let map = Arc::new(Mapping::shared(SharedMemory::create(&path, size)?));
            write_header(&map);
            map
        } else {
            let mut mem = wait_for_file(&path, size, &peer_gone, || {
                format!("peer device {peer:016x} (pid {pid})")
            })?;
            // Both ends will hold the mapping once this side checked it: the name can go
            // (after the magic check below; the creator's drop removes it otherwise).
            mem.unlink(&path);
            let map = Arc::new(Mapping::shared(mem));
            check_header(&map, &path, &peer_gone)?;
            map
        };
        let (side, tx, rx) = if creator { (0, 0, 1) } else { (1, 1, 0) };
        Ok(Self::new(
            peer,
            &map,
            side,
            tx,
            rx,
            Liveness::Process { pid, pidfd },
        ))
    }
}

/// The opening side's wait for the file the `peer` creates (up to [`PEER_WAIT`], or until
/// `peer_gone` says why not).
fn wait_for_file(
    path: &Path,
    size: usize,
    peer_gone: &dyn Fn(&str) -> Option<Error>,
    peer: impl Fn() -> String,
) -> Result<SharedMemory> {
    let start = Instant::now();
    loop {
        if let Some(m) = SharedMemory::open(path, size)? {
            return Ok(m);
        }
        if let Some(e) = peer_gone("created") {
            return Err(e);
        }
        if start.elapsed() >= PEER_WAIT {
            return Err(Error::Unreachable(format!(
                "{} did not create {} within {} s: did it call connect()?",
                peer(),
                path.display(),
                PEER_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The creator's header: ring size, its pid and PID namespace, then the magic (released
/// last: the opening side waits for it).
fn write_header(map: &Mapping) {
    map.u32(OFF_CAP).store(RING_BYTES as u32, Ordering::Relaxed);
    map.u32(OFF_CREATOR)
        .store(std::process::id(), Ordering::Relaxed);
    map.u64(OFF_PIDNS).store(pid_namespace(), Ordering::Relaxed);
    map.u64(OFF_MAGIC).store(SEG_MAGIC, Ordering::Release);
}

/// The opening side's wait for the creator's header (up to [`PEER_WAIT`], or until
/// `peer_gone` says why not), and its check of the ring size.
fn check_header(
    map: &Mapping,
    path: &Path,
    peer_gone: &dyn Fn(&str) -> Option<Error>,
) -> Result<()> {
    let start = Instant::now();
    while map.u64(OFF_MAGIC).load(Ordering::Acquire) != SEG_MAGIC {
        if let Some(e) = peer_gone("initialised") {
            return Err(e);
        }
        if start.elapsed() > PEER_WAIT {
            return Err(Error::Unreachable(format!(
                "{} was never initialised",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if map.u32(OFF_CAP).load(Ordering::Relaxed) != RING_BYTES as u32 {
        return Err(Error::Unreachable(
            "peer uses another link ring size (different gdsync version?)".into(),
        ));
    }
    Ok(())
}

/// This user's directory of link files (created on first use, mode 0700).
fn link_dir() -> Result<std::path::PathBuf> {
    crate::shm::private_dir(std::path::Path::new(SHM_DIR), SHM_USER_DIR)
}

/// Removes link files whose creator died before its peer mapped them (a crash or Ctrl-C
/// early in a run): the creator's pid is in the file's header. Files still being set up
/// (no header yet) are left alone unless older than the set-up wait.
fn sweep_orphaned_links(dir: &std::path::Path) {
    let Ok(dir) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(SHM_PREFIX) {
            continue;
        }
        let path = entry.path();
        if link_file_orphaned(&path) {
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!(
                    "soft device: removed {} (its creator is gone)",
                    path.display()
                ),
                Err(e) => tracing::debug!("soft device: could not remove {}: {e}", path.display()),
            }
        }
    }
}

/// Whether a link file's creator is gone (or the file never got a header in a long time).
fn link_file_orphaned(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 24];
    let Ok(mut f) = std::fs::File::open(path) else {
        return false; // not ours to judge (another user's, or gone already)
    };
    if f.read_exact(&mut head).is_err() || head[..8] != SEG_MAGIC.to_ne_bytes() {
        let age = f
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        return age.is_some_and(|a| a > 2 * PEER_WAIT);
    }
    let creator = u32::from_ne_bytes(head[12..16].try_into().unwrap_or_default());
    let namespace = u64::from_ne_bytes(head[16..24].try_into().unwrap_or_default());
    // Only pids of our own namespace can be judged from our /proc.
    let ours = pid_namespace();
    ours != 0
        && namespace == ours
        && creator != 0
        && creator != std::process::id()
        && process_gone(creator, None)
}

/// This process's PID namespace: the inode of `/proc/self/ns/pid` (0 if unknown).
fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The pid of a process that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }

    #[test]
    fn connecting_to_a_peer_that_died_during_set_up_fails_at_once() {
        // The larger uid opens the file the smaller one creates: this side waits for it.
        let (me, peer) = (0xFFFF_0000_0000_0001u64 | 1, 0x0000_1111_0000_0001u64);
        let pid = dead_pid();
        let start = Instant::now();
        let err = Link::shared_memory(me, peer, pid)
            .err()
            .expect("no link to a dead peer");
        let took = start.elapsed();
        assert!(took < Duration::from_secs(2), "took {took:?}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("process {pid} exited")), "{msg}");
    }

    /// A dead creator's file is removed by the next link this process creates, not only by
    /// a process's first.
    #[test]
    fn every_link_file_created_sweeps_the_dead_ones() {
        let me = std::process::id();
        let first = Link::shared_memory(0x10, 0xFFFF_FFFF_FFFF_FF01, me).unwrap();
        let orphan = link_dir()
            .unwrap()
            .join(format!("{SHM_PREFIX}test-orphan-0000000000000002"));
        let mut head = SEG_MAGIC.to_ne_bytes().to_vec();
        head.extend_from_slice(&(RING_BYTES as u32).to_ne_bytes());
        head.extend_from_slice(&dead_pid().to_ne_bytes());
        head.extend_from_slice(&pid_namespace().to_ne_bytes());
        std::fs::write(&orphan, head).unwrap();
        let second = Link::shared_memory(0x11, 0xFFFF_FFFF_FFFF_FF02, me).unwrap();
        assert!(
            !orphan.exists(),
            "the second link left the dead creator's file"
        );
        drop((first, second));
    }

    /// A file another user made first under the name this device opens is refused, never
    /// mapped (it would carry this device's payloads to them).
    #[test]
    fn a_link_file_open_to_other_users_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let (lo, hi) = (0x20u64, 0xFFFF_FFFF_FFFF_FF03u64);
        let path = link_dir()
            .unwrap()
            .join(format!("{SHM_PREFIX}{lo:016x}-{hi:016x}"));
        let planted = SharedMemory::create(&path, Mapping::size_for(2)).unwrap();
        // SAFETY: the mapping is ours and holds the header's first 8 bytes.
        unsafe { (planted.as_ptr() as *mut u64).write_volatile(SEG_MAGIC) };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = Link::shared_memory(hi, lo, std::process::id())
            .err()
            .expect("mapped a link file open to other users");
        assert!(err.to_string().contains("not a private file"), "{err}");
        drop(planted);
    }

    #[test]
    fn link_files_of_dead_creators_are_swept() {
        let write = |name: &str, pid: u32, namespace: u64| {
            let path = link_dir().unwrap().join(format!("{SHM_PREFIX}{name}"));
            let mut head = SEG_MAGIC.to_ne_bytes().to_vec();
            head.extend_from_slice(&(RING_BYTES as u32).to_ne_bytes());
            head.extend_from_slice(&pid.to_ne_bytes());
            head.extend_from_slice(&namespace.to_ne_bytes());
            std::fs::write(&path, head).unwrap();
            path
        };
        let ns = pid_namespace();
        let orphan = write("test-orphan-0000000000000001", dead_pid(), ns);
        let mine = write("test-live-0000000000000001", std::process::id(), ns);
        // A dead pid of another PID namespace may be a live process there.
        let foreign = write("test-foreign-0000000000000001", dead_pid(), ns ^ 1);
        sweep_orphaned_links(&link_dir().unwrap());
        assert!(!orphan.exists(), "the dead creator's file stays");
        assert!(mine.exists(), "a live creator's file was removed");
        assert!(foreign.exists(), "another namespace's file was removed");
        std::fs::remove_file(mine).unwrap();
        std::fs::remove_file(foreign).unwrap();
    }
}

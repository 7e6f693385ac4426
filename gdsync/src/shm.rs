//! Shared memory between processes of one host: a file in `/dev/shm`, mapped.
//!
//! The soft device's links between processes live in one; tools that need memory two
//! processes both see (pingpong's `--raw` floor across processes) use the same type. Files
//! are created readable and writable by their owner only (mode 0600) and exclusively (an
//! existing name is an error, never silently shared); the creator removes the name when its
//! mapping goes, unless it was removed earlier (once every side holds the mapping). A file
//! is mapped only if it is a regular file of this user that no one else may open (owner and
//! mode checked on the open file, links not followed): another local user who made a file of
//! that name first would otherwise read and write what passes through it. [`private_dir`]
//! gives each user a directory of its own (mode 0700) for such files.

use crate::{Error, Result};
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A shared-memory file mapped read-write into this process.
pub struct SharedMemory {
    ptr: *mut u8,
    len: usize,
    /// The name this mapping removes when it goes (the creator's, until [`unlink`]ed).
    ///
    /// [`unlink`]: Self::unlink
    owned_name: Option<PathBuf>,
}

// SAFETY: the mapping is plain memory that lives until drop; what is stored in it and how
// it is synchronised is the users' business (they use atomics or fences).
unsafe impl Send for SharedMemory {}
// SAFETY: as above.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// Creates `path` (which must not exist) with `len` zero bytes, mode 0600, and maps it.
    pub fn create(path: impl AsRef<Path>, len: usize) -> Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| Error::os(format!("create {}", path.display()), e))?;
        let mapped = file
            .set_len(len as u64)
            .map_err(|e| Error::os(format!("size {} to {len} bytes", path.display()), e))
            .and_then(|()| Self::map(&file, len, path));
        match mapped {
            Ok(mut me) => {
                me.owned_name = Some(path.to_path_buf());
                Ok(me)
            }
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// Maps the existing `path`, which must be `len` bytes long. `Ok(None)` if it does not
    /// exist or does not have that length yet (its creator may still be sizing it).
    pub fn open(path: impl AsRef<Path>, len: usize) -> Result<Option<Self>> {
        let path = path.as_ref();
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path);
        let file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::os(format!("open {}", path.display()), e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| Error::os(format!("stat {}", path.display()), e))?;
        check_private(path, &meta, "file")?;
        if meta.len() != len as u64 {
            return Ok(None);
        }
        Self::map(&file, len, path).map(Some)
    }

    fn map(file: &std::fs::File, len: usize, path: &Path) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid(format!(
                "{}: a shared mapping needs at least one byte",
                path.display()
            )));
        }
        // SAFETY: mapping a file we opened read-write; the kernel checks the arguments.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::os(
                format!("mmap {}", path.display()),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Self {
            ptr: ptr as *mut u8,
            len,
            owned_name: None,
        })
    }

    /// The first byte of the mapping (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: mappings have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Removes the file's name (every side holds the mapping now); the memory stays.
    pub fn unlink(&mut self, path: impl AsRef<Path>) {
        let _ = std::fs::remove_file(path.as_ref());
        self.owned_name = None;
    }
}

/// `dir/<name>-<uid>`, this user's own directory for shared-memory files: created with mode
/// 0700 if it does not exist; refused if it is not a directory (a link included) of this
/// user that no one else may enter.
pub(crate) fn private_dir(dir: &Path, name: &str) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let path = dir.join(format!("{name}-{}", euid()));
    match std::fs::DirBuilder::new().mode(0o700).create(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::os(format!("create {}", path.display()), e)),
    }
    let meta = std::fs::symlink_metadata(&path)
        .map_err(|e| Error::os(format!("stat {}", path.display()), e))?;
    check_private(&path, &meta, "directory")?;
    Ok(path)
}

/// This process's effective uid.
fn euid() -> u32 {
    // SAFETY: geteuid takes nothing and cannot fail.
    unsafe { libc::geteuid() }
}

/// Refuses what is not a `kind` ("file" or "directory") of this user closed to group and
/// others.
fn check_private(path: &Path, meta: &std::fs::Metadata, kind: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let is_kind = match kind {
        "directory" => meta.file_type().is_dir(),
        _ => meta.file_type().is_file(),
    };
    let (uid, mode, me) = (meta.uid(), meta.mode() & 0o7777, euid());
    if is_kind && uid == me && mode & 0o077 == 0 {
        return Ok(());
    }
    let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
    Err(Error::os(
        format!(
            "{}: not a private {kind} of this user (uid {me}): it is {}owned by uid {uid} \
             with mode {mode:04o}; refusing to use it, as another local user could read or \
             change what passes through it (remove it, or ask who made it)",
            path.display(),
            if is_kind { "" } else { "of another type, " },
        ),
        denied,
    ))
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        if let Some(p) = self.owned_name.take() {
            let _ = std::fs::remove_file(p);
        }
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh folder under the system's temporary directory, removed by the caller.
    fn scratch(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("gdsync-shm-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        p
    }

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// `nobody`, or another uid that is not this process's.
    fn other_uid() -> u32 {
        if euid() == 65534 {
            65533
        } else {
            65534
        }
    }

    #[test]
    fn a_file_open_to_other_users_is_not_mapped() {
        let dir = scratch("mode");
        let path = dir.join("f");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        chmod(&path, 0o666);
        let err = SharedMemory::open(&path, 4096)
            .err()
            .expect("mapped a 0666 file");
        assert!(err.to_string().contains("not a private file"), "{err}");
        chmod(&path, 0o600);
        assert!(SharedMemory::open(&path, 4096).unwrap().is_some());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_link_in_place_of_the_file_is_not_followed() {
        let dir = scratch("link");
        let target = dir.join("target");
        std::fs::write(&target, [0u8; 4096]).unwrap();
        chmod(&target, 0o600);
        let path = dir.join("f");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(SharedMemory::open(&path, 4096).is_err(), "followed a link");
        assert!(
            SharedMemory::create(&path, 4096).is_err(),
            "created through a link"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    #[ignore = "needs root (makes a file of another user); .ci/run runs it as root"]
    fn a_file_of_another_user_is_not_mapped() {
        let dir = scratch("owner");
        let path = dir.join("f");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        chmod(&path, 0o600);
        std::os::unix::fs::chown(&path, Some(other_uid()), None).expect("chown (root?)");
        let err = SharedMemory::open(&path, 4096)
            .err()
            .expect("mapped another user's file");
        assert!(
            err.to_string()
                .contains(&format!("owned by uid {}", other_uid())),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_private_directory_is_made_closed_and_checked() {
        let dir = scratch("dir");
        let mine = private_dir(&dir, "x").unwrap();
        let meta = std::fs::metadata(&mine).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        assert_eq!(
            private_dir(&dir, "x").unwrap(),
            mine,
            "the same directory again"
        );
        chmod(&mine, 0o755);
        let err = private_dir(&dir, "x").expect_err("took a directory open to others");
        assert!(err.to_string().contains("not a private directory"), "{err}");
        std::fs::remove_dir(&mine).unwrap();
        std::fs::create_dir(dir.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), &mine).unwrap();
        assert!(
            private_dir(&dir, "x").is_err(),
            "took a link for the directory"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    #[ignore = "needs root (makes a directory of another user); .ci/run runs it as root"]
    fn a_directory_of_another_user_is_refused() {
        let dir = scratch("dirowner");
        let theirs = dir.join(format!("x-{}", euid()));
        std::fs::create_dir(&theirs).unwrap();
        chmod(&theirs, 0o700);
        std::os::unix::fs::chown(&theirs, Some(other_uid()), None).expect("chown (root?)");
        let err = private_dir(&dir, "x").expect_err("took another user's directory");
        assert!(err.to_string().contains("not a private directory"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

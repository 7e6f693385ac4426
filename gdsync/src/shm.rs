//! Shared memory between processes of one host: a file in `/dev/shm`, mapped.
//!
//! The soft device's links between processes live in one; tools that need memory two
//! processes both see (pingpong's `--raw` floor across processes) use the same type. Files
//! are created readable and writable by their owner only (mode 0600) and exclusively (an
//! existing name is an error, never silently shared); the creator removes the name when its
//! mapping goes, unless it was removed earlier (once every side holds the mapping).

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
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::os(format!("open {}", path.display()), e)),
        };
        let size = file
            .metadata()
            .map_err(|e| Error::os(format!("stat {}", path.display()), e))?
            .len();
        if size != len as u64 {
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

impl Drop for SharedMemory {
    fn drop(&mut self) {
        if let Some(p) = self.owned_name.take() {
            let _ = std::fs::remove_file(p);
        }
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

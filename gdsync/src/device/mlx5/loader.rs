//! rdma-core loaded at run time: `dlopen` of `libibverbs.so.1` and `libmlx5.so.1` (as NCCL
//! does), so one binary runs with or without rdma-core. Loaded once per process and never
//! unloaded (verbs objects outlive any one handle).

use super::error::RdmaError;
use super::sys::{IbverbsLib, Mlx5Lib};
use super::RdmaResult;
use std::ffi::OsStr;
use std::sync::OnceLock;

/// libibverbs' file name (its ABI has been `.so.1` since 2006).
pub(crate) const IBVERBS: &str = "libibverbs.so.1";
/// libmlx5's file name (direct verbs).
pub(crate) const MLX5: &str = "libmlx5.so.1";

/// The two rdma-core libraries the mlx5 backend calls.
pub struct Rdma {
    pub(crate) verbs: IbverbsLib,
    pub(crate) mlx5: Mlx5Lib,
}

impl Rdma {
    /// The process's rdma-core, loaded on first use; the same reason every time if it cannot
    /// be loaded.
    pub fn get() -> RdmaResult<&'static Rdma> {
        static LOADED: OnceLock<RdmaResult<Rdma>> = OnceLock::new();
        LOADED
            .get_or_init(|| Rdma::load_from(OsStr::new(IBVERBS), OsStr::new(MLX5)))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Loads the libraries from the given file names or paths (a name is searched for as
    /// `dlopen` does: `LD_LIBRARY_PATH`, the loader cache, the default directories).
    pub fn load_from(ibverbs: &OsStr, mlx5: &OsStr) -> RdmaResult<Rdma> {
        let verbs = load(ibverbs, IBVERBS, "libibverbs1")?;
        // SAFETY: the symbols are looked up by the names and types rdma-core's headers
        // declare (the bindings are generated from them).
        let verbs =
            unsafe { IbverbsLib::from_library(verbs) }.map_err(|e| RdmaError::LibraryTooOld {
                lib: IBVERBS,
                reason: describe(&e),
            })?;
        let mlx5 = load(mlx5, MLX5, "ibverbs-providers")?;
        // SAFETY: as above, for libmlx5's direct-verbs functions.
        let mlx5 =
            unsafe { Mlx5Lib::from_library(mlx5) }.map_err(|e| RdmaError::LibraryTooOld {
                lib: MLX5,
                reason: describe(&e),
            })?;
        Ok(Rdma { verbs, mlx5 })
    }
}

/// `dlopen` of one library, or the reason it failed.
fn load(path: &OsStr, lib: &'static str, package: &'static str) -> RdmaResult<libloading::Library> {
    // SAFETY: loading runs the library's initialisers; rdma-core's only set up its own
    // tables and read its configuration.
    unsafe { libloading::Library::new(path) }.map_err(|e| RdmaError::LibraryMissing {
        lib,
        package,
        reason: describe(&e),
    })
}

/// A loader error with what `dlerror` said (libloading keeps it as the error's source).
fn describe(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(detail) => format!("{e}: {detail}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_says_what_to_install() {
        let e = Rdma::load_from(OsStr::new("/nonexistent/libibverbs.so.1"), OsStr::new(MLX5))
            .err()
            .expect("a missing library fails");
        let msg = e.to_string();
        assert!(
            matches!(e, RdmaError::LibraryMissing { lib: IBVERBS, .. }),
            "{e:?}"
        );
        assert!(msg.contains("apt-get install libibverbs1"), "{msg}");
        assert!(msg.contains("/nonexistent/libibverbs.so.1"), "{msg}");
    }

    #[test]
    fn a_library_without_the_verbs_is_too_old() {
        // libc is there on every Linux machine and has none of the verbs.
        let e = Rdma::load_from(OsStr::new("libc.so.6"), OsStr::new(MLX5))
            .err()
            .expect("libc has no verbs");
        assert!(
            matches!(e, RdmaError::LibraryTooOld { lib: IBVERBS, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("rdma-core 34 or newer"), "{e}");
    }
}

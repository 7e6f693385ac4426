//! What can go wrong on the mlx5 control path: a library or device that is not there (with
//! what to install or check), and a verbs call that failed (the call and its errno).

/// An error of the mlx5 control path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    /// An rdma-core library could not be loaded.
    #[error("{lib} could not be loaded ({reason}): install rdma-core's user-space libraries (Debian/Ubuntu: apt-get install {package})")]
    LibraryMissing {
        /// The library's file name.
        lib: &'static str,
        /// The package that holds it.
        package: &'static str,
        /// What the dynamic loader said.
        reason: String,
    },
    /// A library loaded but lacks a function this backend calls.
    #[error("{lib} is too old ({reason}): the mlx5 backend needs rdma-core 34 or newer")]
    LibraryTooOld {
        /// The library's file name.
        lib: &'static str,
        /// What the dynamic loader said.
        reason: String,
    },
    /// rdma-core is there, but no RDMA device is.
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// The device named is not one of those present.
    #[error("no RDMA device named {name:?} (present: {present})")]
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// The devices present, comma-separated (or "none").
        present: String,
    },
    /// A verbs call failed.
    #[error("{call} failed: {} (errno {errno})", std::io::Error::from_raw_os_error(*.errno))]
    Verbs {
        /// The call.
        call: &'static str,
        /// The errno it left.
        errno: i32,
    },
    /// An argument is out of range, or the device answered something this backend cannot use.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl RdmaError {
    /// `call` failed with the errno the thread holds now (calls that return NULL or -1).
    pub(crate) fn last(call: &'static str) -> Self {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // A failure that left no errno still says which call failed.
        let errno = if errno == 0 { libc::EIO } else { errno };
        RdmaError::Verbs { call, errno }
    }

    /// Checks the return value of a call that returns 0 or an errno (`ibv_modify_qp` and
    /// friends; some return -1 and set errno instead).
    pub(crate) fn check(call: &'static str, rc: i32) -> Result<(), Self> {
        match rc {
            0 => Ok(()),
            rc if rc < 0 => Err(Self::last(call)),
            errno => Err(RdmaError::Verbs { call, errno }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_names_the_call_and_the_errno() {
        let e = RdmaError::check("ibv_modify_qp", libc::EINVAL).unwrap_err();
        assert_eq!(
            e,
            RdmaError::Verbs {
                call: "ibv_modify_qp",
                errno: libc::EINVAL
            }
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with("ibv_modify_qp failed: Invalid argument"),
            "{msg}"
        );
        assert!(RdmaError::check("ibv_modify_qp", 0).is_ok());
    }
}

//! The locked-memory limit (`RLIMIT_MEMLOCK`, `ulimit -l`): what it is, and what to tell a
//! user whose registration or queue creation an RDMA device refused for lack of memory
//! (rings, CQs and registered regions are pinned, and count against it).

/// The process's locked-memory limit (`RLIMIT_MEMLOCK`'s soft limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemlockLimit {
    /// No limit (`ulimit -l unlimited`).
    Unlimited,
    /// At most this many bytes may be locked.
    Bytes(u64),
}

impl std::fmt::Display for MemlockLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemlockLimit::Unlimited => f.write_str("unlimited"),
            MemlockLimit::Bytes(n) => write!(f, "{} KiB", n / 1024),
        }
    }
}

/// The process's locked-memory limit (`getrlimit(RLIMIT_MEMLOCK)`); `None` where it cannot be
/// read.
pub fn memlock_limit() -> Option<MemlockLimit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return None;
    }
    Some(match r.rlim_cur {
        libc::RLIM_INFINITY => MemlockLimit::Unlimited,
        n => MemlockLimit::Bytes(n),
    })
}

/// What a device's ENOMEM means under `limit`, and what to do about it (one line).
pub(crate) fn enomem_hint(limit: Option<MemlockLimit>) -> String {
    match limit {
        Some(MemlockLimit::Unlimited) => {
            "locked memory is unlimited here, so the device or the kernel ran out of memory".into()
        }
        Some(l @ MemlockLimit::Bytes(_)) => format!(
            "the locked-memory limit (ulimit -l) is {l}, and rings and registered memory are \
             locked: raise it (ulimit -l unlimited; memlock in /etc/security/limits.conf, or \
             LimitMEMLOCK=infinity for a systemd service or --ulimit memlock=-1 for a container)"
        ),
        None => "the locked-memory limit (ulimit -l) could not be read: check that it is \
                 large enough for the rings and registered memory (ulimit -l unlimited)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_processs_soft_limit() {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in memlock_limit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) }, 0);
        let want = if r.rlim_cur == libc::RLIM_INFINITY {
            MemlockLimit::Unlimited
        } else {
            MemlockLimit::Bytes(r.rlim_cur)
        };
        assert_eq!(memlock_limit(), Some(want));
    }

    #[test]
    fn an_enomem_names_the_limit_and_how_to_raise_it() {
        let h = enomem_hint(Some(MemlockLimit::Bytes(64 * 1024)));
        assert!(
            h.contains("ulimit -l) is 64 KiB") && h.contains("raise it"),
            "{h}"
        );
        assert!(!h.contains('\n'), "{h}");
        let h = enomem_hint(Some(MemlockLimit::Unlimited));
        assert!(
            h.contains("unlimited") && h.contains("ran out of memory"),
            "{h}"
        );
        assert!(enomem_hint(None).contains("could not be read"));
        assert_eq!(MemlockLimit::Unlimited.to_string(), "unlimited");
    }
}

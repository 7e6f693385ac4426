//! Values another process must not guess (memory-key bytes, device ids, nonces, secrets),
//! drawn from the operating system's cryptographic generator (`getrandom(2)`), never from a
//! generator whose next output follows from its last ones.

use std::io::Error as IoError;

/// Fills `b` with bytes of the OS's cryptographic generator.
pub(crate) fn fill(b: &mut [u8]) -> std::io::Result<()> {
    getrandom::fill(b).map_err(|e| IoError::other(format!("the OS random generator: {e}")))
}

/// A random 64-bit value from the OS's generator. Where the generator fails (a kernel without
/// `getrandom(2)` and no `/dev/urandom`), a value mixed from the clock and a counter, with a
/// warning: unique, but guessable.
pub(crate) fn u64() -> u64 {
    let mut b = [0u8; 8];
    if let Err(e) = fill(&mut b) {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!("{e}: memory keys and device ids fall back to guessable values")
        });
        return fallback();
    }
    u64::from_ne_bytes(b)
}

fn fallback() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let n = N.fetch_add(1, Ordering::Relaxed);
    (t ^ n.rotate_left(40) ^ u64::from(std::process::id()).rotate_left(20))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

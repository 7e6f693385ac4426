//! One rank's side of the exchange, whatever carries it (the soft device, the messaging
//! layer, or direct stores for the `--raw` floor).

use anyhow::Result;

/// Send message `i` of `size` bytes, wait for the peer's.
pub(crate) trait Wire {
    fn send(&mut self, i: u64, size: usize) -> Result<()>;
    fn wait(&mut self, i: u64, size: usize) -> Result<()>;
    /// Before a new size: clear what the peer writes into.
    fn reset(&mut self, size: usize) -> Result<()>;
    /// After the last iteration of a size: finish what is still queued (before the ranks
    /// synchronise, when this rank stops driving its work forward).
    fn drain(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Spin, but let other threads run when the machine has fewer cores than busy threads.
/// A rank spinning on memory lends its thread to its soft engine: on few cores, packets
/// reach the engine only through a thread that runs it (a no-op with a core per engine).
/// The engine runs last, so that the caller looks at its memory right after it. The first
/// spins skip even the `pause` hint, as perftest's busy poll does (it costs up to 140 cycles,
/// which add to the time a message takes to be seen).
pub(crate) fn relax(spins: u32) {
    spin(spins);
    gdasync::gdsync::progress();
}

/// [`relax`] without lending the thread to the soft engines: the `--raw` floor's wait (with
/// `--vs-raw` a device exists, and its rounds are no part of the floor).
pub(crate) fn spin(spins: u32) {
    if spins >= 2000 {
        std::thread::yield_now();
    } else if spins >= 256 {
        std::hint::spin_loop();
    }
}

/// The byte message `i` ends with (never 0, the cleared value).
pub(crate) fn marker(i: u64) -> u8 {
    (i % 251) as u8 + 1
}

/// A zeroed buffer of at least `n` bytes that lives as long as the process (registered
/// memory must outlive its registration; the benchmark keeps it to the end).
pub(crate) fn leak(n: usize) -> &'static mut [u8] {
    Box::leak(vec![0u8; n.max(64)].into_boxed_slice())
}

//! `--raw --relay`: the `--raw` loop with a CPU thread in each direction. Each rank stores its
//! marker into a word of its own instead of the peer's buffer, and a thread per rank, spinning,
//! copies each new value into the peer's receive word, as the soft device's
//! engine thread carries a doorbell the GPU stored to the peer's memory. The thread does
//! nothing else (no WQE, no link, no completion), so the loop is the floor of any NIC made of
//! CPU threads: what the GPU's store costs to reach a CPU and the CPU's store to reach the
//! other GPU, beside `--raw`, where the GPUs reach each other's words directly.

use gdasync::gdsync::SignalWords;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Index of rank `rank`'s word in the relay's [`SignalWords`] (64-bit words): 256 bytes apart,
/// so the two ranks' stores and their threads' loads never share a cache line.
const fn slot(rank: usize) -> usize {
    rank * 32
}

/// The two relay threads and the words they watch. Dropping it stops and joins them.
pub(crate) struct Relay {
    words: Arc<SignalWords>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Starts a thread per rank that copies the rank's relay word into `dest[1 - rank]`, the
    /// peer's receive word (pinned host memory leaked for the process's life, as `--raw`'s
    /// buffers are).
    pub(crate) fn start(dest: [u64; 2]) -> std::io::Result<Relay> {
        let mut relay = Relay {
            words: Arc::new(SignalWords::new(slot(1) + 1)),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::with_capacity(2),
        };
        for rank in 0..2 {
            let (words, stop, to) = (relay.words.clone(), relay.stop.clone(), dest[1 - rank]);
            // (A failed spawn drops `relay`, which stops the thread already started.)
            let t = std::thread::Builder::new()
                .name(format!("relay {rank}"))
                .spawn(move || carry(&words, slot(rank), to, &stop))?;
            relay.threads.push(t);
        }
        Ok(relay)
    }

    /// The words the ranks store their markers into, for lists that keep them alive.
    pub(crate) fn words(&self) -> &SignalWords {
        &self.words
    }

    /// Index of rank `rank`'s word in [`words`](Self::words).
    pub(crate) fn slot(rank: usize) -> usize {
        slot(rank)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Copies word `from` of `words` into the word at `to` each time it changes, until `stop`.
fn carry(words: &SignalWords, from: usize, to: u64, stop: &AtomicBool) {
    let mut last = words.load32(from);
    while !stop.load(Ordering::Relaxed) {
        let v = words.load32(from);
        if v != last {
            // SAFETY: `to` is the last 4 bytes of a receive buffer in pinned host memory
            // leaked for the process's life (`Buf::leak_register`), 4-byte aligned.
            unsafe { std::ptr::write_volatile(to as *mut u32, v) };
            last = v;
        }
        std::hint::spin_loop();
    }
}

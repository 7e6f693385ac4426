//! A window put with signal (`mp`): every rank exposes a window of registered memory; rank 0
//! writes data into rank 1's window and then an 8-byte signal after it. Rank 1 does not poll
//! with its CPU: an executor (a host stream here, a CUDA stream on a GPU alike) waits for the
//! signal, and the data is there once the signal is (one connection delivers in order).
//!
//! ```text
//! cargo run --release --example window_put
//! ```

use gdasync::gdsync::exec::HostStream;
use gdasync::gdsync::ops::WaitCond;
use gdasync::gdsync::{Access, Device, PinnedBuffer, Result};
use gdasync::mp::{bootstrap::ThreadBootstrap, Comm};

const DATA_AT: usize = 64; // the signal word sits at offset 0, the data at 64
const MESSAGE: &[u8] = b"put into rank 1's window, then signalled";

fn main() -> Result<()> {
    let dev = Device::soft()?; // one soft device serving both ranks, threads of this process
    std::thread::scope(|s| {
        let ranks: Vec<_> = ThreadBootstrap::group(2)
            .into_iter()
            .map(|boot| s.spawn(|| rank(Comm::new(Box::new(boot), &dev)?)))
            .collect();
        ranks
            .into_iter()
            .try_for_each(|r| r.join().expect("a rank panicked"))
    })
}

fn rank(mut comm: Comm) -> Result<()> {
    let win_buf = PinnedBuffer::new(128);
    let win_mr = comm
        .pd()
        .register_pinned(&win_buf, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let window = comm.window(&win_mr)?; // collective: every rank's region, by rank
    if comm.rank() == 0 {
        let src = PinnedBuffer::new(128);
        src.write_at(0, MESSAGE);
        src.write_at(DATA_AT, &1u64.to_le_bytes()); // the signal's value
        let src_mr = comm.pd().register_pinned(&src, Access::empty())?;
        let (data, signal) = (
            src_mr.sge(..MESSAGE.len()),
            src_mr.sge(DATA_AT..DATA_AT + 8),
        );
        let put = comm.iput_signal(data, &window, 1, DATA_AT as u64, signal, 0)?;
        comm.wait(put)?;
    } else {
        // The wait holds the buffer alive until the stream has passed it.
        let stream = HostStream::new()?;
        stream.enqueue(win_buf.wait64(0, 1, WaitCond::Geq));
        stream.synchronize()?;
        let mut got = vec![0u8; MESSAGE.len()];
        win_buf.read_at(DATA_AT, &mut got);
        assert_eq!(got, MESSAGE);
        println!(
            "rank 1: a host stream saw the signal; the window holds {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    comm.barrier()?; // rank 0's window and rank 1's stay registered until both are done
    comm.finalize()
}

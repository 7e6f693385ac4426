//! A stream-triggered RDMA write: the CPU prepares the work request ahead of time; an executor
//! (a CUDA stream on a GPU, else a host stream: a CPU thread running the same op lists in
//! order) rings the doorbell and waits for the completion, with no CPU call in between.
//!
//! ```text
//! cargo run --release --example stream_write            # a CUDA stream where CUDA is present
//! cargo run --release --example stream_write -- --cuda  # insist on the CUDA stream
//! ```

use gdasync::gdsync::cuda::{Cuda, CudaStream};
use gdasync::gdsync::exec::{Executor, HostStream};
use gdasync::gdsync::{Access, Device, PinnedBuffer, QpConfig, Result, SendWr};
use std::process::ExitCode;

fn main() -> ExitCode {
    let want_cuda = std::env::args().skip(1).any(|a| a == "--cuda");
    let outcome = if want_cuda || Cuda::available() {
        CudaStream::new(0).and_then(|s| write_on(&s, "a CUDA stream on GPU 0"))
    } else {
        HostStream::new().and_then(|s| write_on(&s, "a host stream (no GPU here)"))
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One RDMA write rung and waited for by `exec`, which `synchronize` waits for.
fn write_on(exec: &(impl Executor + Synchronize), name: &str) -> Result<()> {
    let dev = Device::soft()?;
    let pd = dev.alloc_pd();
    // A dedicated send CQ: the executor waits for this QP's completions by their position.
    let (scq, rcq, cq_b) = (dev.create_cq(64)?, dev.create_cq(64)?, dev.create_cq(64)?);
    let mut a = pd.create_qp(&scq, &rcq, &QpConfig::default())?;
    let mut b = pd.create_qp(&cq_b, &cq_b, &QpConfig::default())?;
    a.connect(&b.endpoint())?;
    b.connect(&a.endpoint())?;

    // Pinned host memory: a GPU can reach it too.
    let (src, dst) = (PinnedBuffer::new(32), PinnedBuffer::new(32));
    src.write_at(0, b"rung by the executor");
    let src_mr = pd.register_pinned(&src, Access::empty())?;
    let dst_mr = pd.register_pinned(&dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;

    // Prepare (the WQE is written now), commit (the doorbell as an op list), then hand both
    // the doorbell and the completion wait to the executor.
    let wr = SendWr::write(dst_mr.remote().at(0)).sge(src_mr.sge(..20));
    let prepared = a.prepare_send(&wr)?;
    let (ticket, doorbell) = a.commit(prepared).map_err(|e| e.error)?;
    exec.submit(doorbell)?;
    exec.submit(a.send_wait_ops(&ticket)?)?;
    exec.sync()?;

    let mut landed = [0u8; 20];
    dst.read_at(0, &mut landed);
    assert_eq!(&landed, b"rung by the executor");
    println!(
        "executor: {name}; RDMA write of 20 bytes rung and completed: {:?}",
        String::from_utf8_lossy(&landed)
    );
    Ok(())
}

/// Waiting until an executor has run everything submitted so far.
trait Synchronize {
    fn sync(&self) -> Result<()>;
}

impl Synchronize for HostStream {
    fn sync(&self) -> Result<()> {
        self.synchronize()
    }
}

impl Synchronize for CudaStream {
    fn sync(&self) -> Result<()> {
        self.synchronize()
    }
}

//! Streams: executors that run op lists in order, with no CPU call between them: a host
//! stream (a CPU thread, runs anywhere) or a CUDA stream (the GPU runs the lists as stream
//! memory operations), and the shortcuts that post a send or wait for a completion on one.

use crate::args;
use crate::handle::{self, handle_impl};
use crate::ops::{gdasync_ops, take_ops};
use crate::qp::{gdasync_qp, gdasync_recv_ticket, gdasync_send_ticket, gdasync_send_wr};
use crate::status::{guard, Fail, Res, GDASYNC_OK};
use gdsync::cuda::CudaStream;
use gdsync::exec::{Executor, HostStream};
use gdsync::ops::Ops;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// A stream: op lists submitted to it run in order, on a CPU thread (a host stream) or on a
/// GPU (a CUDA stream). Thread-safe; lists submitted from several threads run in the order
/// the calls were made.
pub struct gdasync_stream {
    _opaque: [u8; 0],
}

/// A host stream or a CUDA stream.
pub(crate) enum Stream {
    Host(HostStream),
    Cuda(CudaStream),
}
/// The stream, shared by calls in flight.
pub(crate) type SharedStream = Arc<Stream>;
handle_impl!(gdasync_stream, 8, SharedStream);

impl Executor for Stream {
    fn submit(&self, ops: Ops) -> gdsync::Result<()> {
        match self {
            Stream::Host(s) => s.submit(ops),
            Stream::Cuda(s) => s.submit(ops),
        }
    }
}

impl Stream {
    /// An executor on `cu_stream`, a CUDA stream of the program's own in GPU `gpu`'s primary
    /// context (NULL: the legacy default stream).
    pub(crate) fn wrap_cuda(cu_stream: *mut c_void, gpu: c_int) -> Res<Stream> {
        let cuda = gdsync::cuda::Cuda::get()?;
        // SAFETY: the header's contract: the stream is live, of GPU gpu's primary context, and
        // outlives the gdasync stream made on it.
        let s = unsafe { cuda.wrap_stream(gpu, cu_stream.cast())? };
        Ok(Stream::Cuda(s))
    }

    pub(crate) fn synchronize(&self) -> Res<()> {
        match self {
            Stream::Host(s) => s.synchronize()?,
            Stream::Cuda(s) => s.synchronize()?,
        }
        Ok(())
    }
}

/// Creates a host stream: a CPU thread that runs the lists (a wait gives up after 60 s).
#[no_mangle]
pub extern "C" fn gdasync_stream_create_host(out: *mut *mut gdasync_stream) -> c_int {
    guard("gdasync_stream_create_host", || {
        args::check_ptr(out, "out")?;
        let s = Arc::new(Stream::Host(HostStream::new()?));
        args::write(out, handle::insert(s)?, "out")?;
        Ok(GDASYNC_OK)
    })
}

/// Creates a CUDA stream on GPU `gpu` (non-blocking, in the GPU's primary context). Its
/// `CUstream` (`gdasync_stream_cuda_handle`) takes kernels and events of the program's own.
/// Fails with `GDASYNC_ERR_UNSUPPORTED` where there is no CUDA driver or GPU.
#[no_mangle]
pub extern "C" fn gdasync_stream_create_cuda(gpu: c_int, out: *mut *mut gdasync_stream) -> c_int {
    guard("gdasync_stream_create_cuda", || {
        args::check_ptr(out, "out")?;
        let s = Arc::new(Stream::Cuda(CudaStream::new(gpu)?));
        args::write(out, handle::insert(s)?, "out")?;
        Ok(GDASYNC_OK)
    })
}

/// Tells gdasync whether the job's ranks on this host run CUDA streams on more than one GPU,
/// other processes' included (`spans` non-zero; one process per GPU, as under `mpirun`). CUDA
/// streams then run lists without copies as small kernels (`GDSYNC_LIST_KERNEL=auto`, the
/// default), as they do when one process's streams span GPUs: on a two-H200 host a stream's
/// own stores cost about 3 us each while streams on both GPUs run them, whichever processes
/// they belong to. Call it before creating the first CUDA stream. Returns `GDASYNC_OK`.
#[no_mangle]
pub extern "C" fn gdasync_set_job_spans_gpus(spans: c_int) -> c_int {
    gdsync::cuda::set_job_spans_gpus(spans != 0);
    GDASYNC_OK
}

/// Makes a gdasync stream of `cu_stream`, a CUDA stream (`CUstream` or `cudaStream_t`) of
/// the program's own in GPU `gpu`'s primary context (the runtime API's streams are; NULL is
/// the legacy default stream): lists submitted to it run in order with the program's work
/// there. The stream must outlive the gdasync stream, and stays the program's (destroying
/// the gdasync stream waits for its lists and leaves the CUDA stream alone).
#[no_mangle]
pub extern "C" fn gdasync_stream_wrap_cuda(
    cu_stream: *mut c_void,
    gpu: c_int,
    out: *mut *mut gdasync_stream,
) -> c_int {
    guard("gdasync_stream_wrap_cuda", || {
        args::check_ptr(out, "out")?;
        let s = Arc::new(Stream::wrap_cuda(cu_stream, gpu)?);
        args::write(out, handle::insert(s)?, "out")?;
        Ok(GDASYNC_OK)
    })
}

/// Stores the `CUstream` of a CUDA stream at `cu_stream`: the program may launch kernels and
/// record or wait for events on it, in order with the lists. Owned by `stream`.
#[no_mangle]
pub extern "C" fn gdasync_stream_cuda_handle(
    stream: *mut gdasync_stream,
    cu_stream: *mut *mut c_void,
) -> c_int {
    guard("gdasync_stream_cuda_handle", || {
        args::check_ptr(cu_stream, "cu_stream")?;
        match &*handle::get(stream, "stream")? {
            Stream::Cuda(s) => args::write(cu_stream, s.raw().cast(), "cu_stream")?,
            Stream::Host(_) => {
                return Err(Fail::invalid("stream is a host stream; it has no CUstream"))
            }
        }
        Ok(GDASYNC_OK)
    })
}

/// Submits `ops` to `stream`, behind everything submitted before; consumes `ops`.
#[no_mangle]
pub extern "C" fn gdasync_stream_submit(
    stream: *mut gdasync_stream,
    ops: *mut gdasync_ops,
) -> c_int {
    guard("gdasync_stream_submit", || {
        let s = handle::get(stream, "stream")?;
        s.submit(take_ops(ops)?)?;
        Ok(GDASYNC_OK)
    })
}

/// Blocks until everything submitted to `stream` has run; returns the first error a list
/// met (a wait that timed out), which the lists after it were skipped for.
#[no_mangle]
pub extern "C" fn gdasync_stream_synchronize(stream: *mut gdasync_stream) -> c_int {
    guard("gdasync_stream_synchronize", || {
        handle::get(stream, "stream")?.synchronize()?;
        Ok(GDASYNC_OK)
    })
}

/// Destroys `stream` once what was submitted to it has run (or failed).
#[no_mangle]
pub extern "C" fn gdasync_stream_destroy(stream: *mut gdasync_stream) -> c_int {
    guard("gdasync_stream_destroy", || {
        let s = handle::remove(stream, "stream")?;
        s.synchronize()?;
        Ok(GDASYNC_OK)
    })
}

/// Posts `wr` on `stream`: prepares it now and submits the op list that rings its doorbell,
/// so the send goes out when the stream reaches it. Its ticket goes to `ticket` (may be
/// NULL). A QP's sends posted on a stream may not be mixed with CPU posts until the stream
/// has rung them.
#[no_mangle]
pub extern "C" fn gdasync_qp_post_send_on_stream(
    qp: *mut gdasync_qp,
    wr: *const gdasync_send_wr,
    stream: *mut gdasync_stream,
    ticket: *mut gdasync_send_ticket,
) -> c_int {
    guard("gdasync_qp_post_send_on_stream", || {
        let wr = crate::qp::send_wr(wr)?;
        let s = handle::get(stream, "stream")?;
        // Submitted under the QP's lock: the stream gets its commits in their order.
        let t = crate::qp::with_host(qp, |q| {
            let p = q.prepare_send(&wr)?;
            let (t, ops) = q.commit(p).map_err(|e| Fail::from(e.error))?;
            s.submit(ops)?;
            Ok(t)
        })?;
        args::write_opt(ticket, t.into(), "ticket")?;
        Ok(GDASYNC_OK)
    })
}

/// Makes `stream` wait for the completion of the send `ticket` names (and consume it):
/// what is submitted after runs once the send completed.
#[no_mangle]
pub extern "C" fn gdasync_qp_wait_send_on_stream(
    qp: *mut gdasync_qp,
    ticket: *const gdasync_send_ticket,
    stream: *mut gdasync_stream,
) -> c_int {
    guard("gdasync_qp_wait_send_on_stream", || {
        let t = args::read(ticket, "ticket")?;
        let s = handle::get(stream, "stream")?;
        let ops = crate::qp::with_host(qp, |q| Ok(q.send_wait_ops(&t.into())?))?;
        s.submit(ops)?;
        Ok(GDASYNC_OK)
    })
}

/// Makes `stream` wait for the completion of the receive `ticket` names (and consume it).
#[no_mangle]
pub extern "C" fn gdasync_qp_wait_recv_on_stream(
    qp: *mut gdasync_qp,
    ticket: *const gdasync_recv_ticket,
    stream: *mut gdasync_stream,
) -> c_int {
    guard("gdasync_qp_wait_recv_on_stream", || {
        let t = args::read(ticket, "ticket")?;
        let s = handle::get(stream, "stream")?;
        let ops = crate::qp::with_host(qp, |q| Ok(q.recv_wait_ops(&t.into())?))?;
        s.submit(ops)?;
        Ok(GDASYNC_OK)
    })
}

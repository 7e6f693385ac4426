//! The library's error type.

use crate::format::Syndrome;

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, with a message that says what to check.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The QP is not connected to a peer yet.
    #[error("QP {qpn:#x} is not connected: call connect() with the peer's endpoint first")]
    NotConnected {
        /// The QP number.
        qpn: u32,
    },
    /// The QP is in the error state; posted work is flushed.
    #[error("QP {qpn:#x} is in the error state after a failed work request (its other work completes with WR_FLUSH): look at the first error completion, then create and connect a new QP")]
    QpInError {
        /// The QP number.
        qpn: u32,
    },
    /// The send or receive ring has no free slot.
    #[error("{ring} ring of QP {qpn:#x} is full ({used}/{size} in use): poll completions (or wait for them on the executor) before posting more{hint}")]
    RingFull {
        /// "send" or "receive".
        ring: &'static str,
        /// The QP number.
        qpn: u32,
        /// Slots in use.
        used: u32,
        /// Ring size.
        size: u32,
        /// Extra advice.
        hint: &'static str,
    },
    /// Prepared sends were committed out of the order they were prepared in.
    #[error("prepared send at index {got} committed out of order (expected {expected}): commit prepared sends in the order they were prepared")]
    OutOfOrder {
        /// The next index that may be committed.
        expected: u64,
        /// The index of the send given.
        got: u64,
    },
    /// A completion wait needs a completion number that cannot be predicted.
    #[error("cannot wait for this completion on an executor: {0}")]
    NotWaitable(&'static str),
    /// A wait did not pass in time.
    #[error("wait timed out after {timeout_ms} ms on {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The timeout in milliseconds.
        timeout_ms: u64,
    },
    /// A completion reported an error status.
    #[error("{} on QP {qpn:#x} failed with {}", work_request(*.wr_id), describe_syndrome(*.syndrome))]
    Completion {
        /// The work request id (`u64::MAX` where it is not known: [`crate::Cq::check`],
        /// requests of the messaging layer).
        wr_id: u64,
        /// The QP number.
        qpn: u32,
        /// The error syndrome.
        syndrome: Syndrome,
    },
    /// The CQ overran: more completions arrived than it holds; completions were lost.
    #[error("CQ {cqn:#x} overran: size it for the work outstanding and poll it")]
    CqOverrun {
        /// The CQ number.
        cqn: u32,
    },
    /// A CPU poll would consume a completion that an executor wait, prepared and not run
    /// yet, consumes when it runs ([`Cq::wait_ops`](crate::Cq::wait_ops)).
    #[error("CQ {cqn:#x}: completion {index} is reserved for an executor (stream) wait on completion {wait}, which consumes every completion up to its own and has not run yet: synchronize the stream that runs it (or drop the list if it was never submitted) before polling, or poll this work on a CQ of its own")]
    CqBusy {
        /// The CQ number.
        cqn: u32,
        /// The completion the poll would consume.
        index: u64,
        /// The completion the wait is for.
        wait: u64,
    },
    /// The peer cannot be reached with the links this build has.
    #[error("cannot reach the peer: {0}")]
    Unreachable(String),
    /// The operation is not supported by this device or build.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The device or its engine is gone.
    #[error("device closed: {0}")]
    DeviceClosed(String),
    /// CUDA is not usable here (no driver, no GPU, or disabled).
    #[error("CUDA not available: {0}")]
    NoCuda(String),
    /// A CUDA driver call failed.
    #[error("{call} failed: {name} ({code})")]
    Cuda {
        /// The driver call.
        call: &'static str,
        /// The CUresult.
        code: i32,
        /// Its name.
        name: String,
    },
    /// The soft device's copy to or from GPU memory did not finish in time: the GPU queue it
    /// went to is held, most likely by a stream of the program blocked in a memory wait that
    /// shares its hardware queue. The copy is abandoned (its buffer is never reused).
    #[error("GPU {ordinal}: the soft device's {direction} copy did not finish in {waited_ms} ms; a stream blocked in a memory wait may share its hardware queue (more streams than CUDA_DEVICE_MAX_CONNECTIONS): move GPU payloads by the trigger's own copies (GDSYNC_STAGING=on) or set CUDA_DEVICE_MAX_CONNECTIONS=32 before the program starts")]
    GpuCopyStalled {
        /// The GPU.
        ordinal: i32,
        /// "host-to-GPU" or "GPU-to-host".
        direction: &'static str,
        /// How long the copy was waited for.
        waited_ms: u64,
    },
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Os {
        /// The call that failed.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// `wr_id` as a message names it (`u64::MAX`: not known, as in [`crate::Cq::check`]).
fn work_request(wr_id: u64) -> String {
    if wr_id == u64::MAX {
        "a work request".into()
    } else {
        format!("work request {wr_id}")
    }
}

/// A syndrome as messages and logs name it: its name, the `ibv_wc_status` rdma-core reports
/// for it, and what to check.
pub(crate) fn describe_syndrome(s: Syndrome) -> String {
    let (ibv, hint) = syndrome_meaning(s);
    format!("{s:?} ({ibv}): {hint}")
}

/// The `ibv_wc_status` name of a syndrome and what it usually means.
fn syndrome_meaning(s: Syndrome) -> (&'static str, &'static str) {
    use Syndrome::*;
    match s {
        LocalLength => ("IBV_WC_LOC_LEN_ERR", "the message is longer than the receive buffer: post larger receives"),
        LocalQpOp => ("IBV_WC_LOC_QP_OP_ERR", "the device could not execute the WQE (bad opcode or format)"),
        LocalProt => ("IBV_WC_LOC_PROT_ERR", "a local SGE is outside its memory region, or its lkey or protection domain is wrong"),
        WrFlush => ("IBV_WC_WR_FLUSH_ERR", "not executed because the QP was already in the error state: the first error completion says why"),
        MwBind => ("IBV_WC_MW_BIND_ERR", "a memory window bind failed"),
        BadResp => ("IBV_WC_BAD_RESP_ERR", "the peer sent an unexpected response"),
        LocalAccess => ("IBV_WC_LOC_ACCESS_ERR", "a local memory access failed (a region without LOCAL_WRITE for a receive or read?)"),
        RemoteInvalReq => ("IBV_WC_REM_INV_REQ_ERR", "the peer rejected the request (longer than its receive buffer, or an operation its region does not allow)"),
        RemoteAccess => ("IBV_WC_REM_ACCESS_ERR", "the peer refused the access: check the rkey, the bounds and the region's REMOTE_* access rights"),
        RemoteOp => ("IBV_WC_REM_OP_ERR", "the peer could not complete the operation"),
        TransportRetryExc => ("IBV_WC_RETRY_EXC_ERR", "the peer stopped answering: its process died, it dropped its device or QP, or it did not connect within QpConfig::timeout"),
        RnrRetryExc => ("IBV_WC_RNR_RETRY_EXC_ERR", "the peer had no receive posted and the retries ran out: post receives before the sends, or raise QpConfig::rnr_retry"),
        RemoteAborted => ("IBV_WC_REM_ABORT_ERR", "the peer aborted the operation"),
    }
}

impl Error {
    /// An [`Error::InvalidArgument`] with this message.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
    /// An [`Error::Os`]: `what` failed with `source`.
    pub fn os(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Os {
            what: what.into(),
            source,
        }
    }
}

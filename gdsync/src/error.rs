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
    #[error("QP {qpn:#x} is in the error state (its work completes with WR_FLUSH)")]
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
    #[error("work request {wr_id} on QP {qpn:#x} completed with {syndrome:?}")]
    Completion {
        /// The work request id.
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

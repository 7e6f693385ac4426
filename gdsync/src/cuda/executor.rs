//! A CUDA stream as an executor: op lists submitted to it run when the stream gets there.
//! (Here rather than in `exec/`, so the executors' room names no CUDA glue.)

use super::CudaStream;
use crate::exec::Executor;
use crate::ops::Ops;
use crate::Result;

impl Executor for CudaStream {
    fn submit(&self, ops: Ops) -> Result<()> {
        self.enqueue(ops)
    }
}

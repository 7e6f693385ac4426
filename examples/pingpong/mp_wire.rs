//! `--api mp --trigger cpu`: the messaging layer's `isend`/`irecv` with credits, waited on the
//! CPU.

use super::wire::{leak, marker, Wire};
use anyhow::{bail, Result};
use gdasync::gdsync::{Device, MemoryRegion};
use gdasync::mp::bootstrap::Bootstrap;
use gdasync::mp::{Comm, Request};
use std::collections::VecDeque;

/// Receives `--api mp` keeps posted.
pub(crate) const RECVS_AHEAD: usize = 64;

/// Sends `--api mp` leaves outstanding before it waits for them, all but the newest at once
/// (one poll of the send completion queue finds them all complete): as the gdsync loop reaps
/// its send completions only now and then, not one per message.
const SENDS_BEHIND: usize = 16;

/// Receives are kept [`RECVS_AHEAD`] deep, as the gdsync loop keeps its receive ring full, and
/// posted again `--recv-batch` at a time (`Comm::irecv_batch`: one credit, a request and a
/// response through the NIC, per batch); sends are waited for [`SENDS_BEHIND`] at a time,
/// after the next is posted.
pub(crate) struct MpWire {
    comm: Comm,
    sbuf: MemoryRegion<'static>,
    rbuf: MemoryRegion<'static>,
    recvs: VecDeque<Request>,
    sends: VecDeque<Request>,
    batch: usize,
}

impl MpWire {
    pub(crate) fn new(
        boot: Box<dyn Bootstrap>,
        dev: &Device,
        max: usize,
        batch: usize,
    ) -> Result<Self> {
        let comm = Comm::new(boot, dev)?;
        let sbuf = comm.register(leak(max))?;
        let rbuf = comm.register(leak(max))?;
        Ok(Self {
            comm,
            sbuf,
            rbuf,
            recvs: Default::default(),
            sends: Default::default(),
            batch,
        })
    }
    fn peer(&self) -> usize {
        1 - self.comm.rank()
    }
    /// Posts receives again once `batch` of them are used (every one, into the whole
    /// buffer: messages of one ping-pong never overlap).
    fn top_up(&mut self, min: usize) -> Result<()> {
        let missing = RECVS_AHEAD - self.recvs.len();
        if missing >= min {
            let sges = vec![self.rbuf.sge(..); missing];
            let peer = self.peer();
            self.recvs.extend(self.comm.irecv_batch(&sges, peer)?);
        }
        Ok(())
    }
}

impl Wire for MpWire {
    fn send(&mut self, i: u64, size: usize) -> Result<()> {
        if size > 0 {
            self.sbuf.write_volatile_u8(size - 1, marker(i));
        }
        let sent = self.comm.isend(self.sbuf.sge(..size), self.peer())?;
        self.sends.push_back(sent);
        // The older sends are waited for once this one is out: the poll is not on the
        // message's path.
        if self.sends.len() > SENDS_BEHIND {
            let older: Vec<Request> = self.sends.drain(..SENDS_BEHIND).collect();
            self.comm.wait_all(&older)?;
        }
        // Receives topped up right behind the send: their credit travels after the
        // message, not in front of it, and reaches the peer before the peer answers.
        self.top_up(self.batch)
    }
    fn wait(&mut self, _i: u64, size: usize) -> Result<()> {
        if self.recvs.is_empty() {
            self.top_up(1)?;
        }
        let Some(r) = self.recvs.pop_front() else {
            bail!("no receive posted");
        };
        let n = self.comm.wait(r)?;
        if n as usize != size {
            bail!("received {n} bytes, expected {size}");
        }
        Ok(())
    }
    fn reset(&mut self, _size: usize) -> Result<()> {
        self.top_up(1)
    }
    fn drain(&mut self) -> Result<()> {
        // The last send may still wait for its credit: only calls into the communicator post
        // it, and the peer waits for it.
        let sends: Vec<Request> = self.sends.drain(..).collect();
        self.comm.wait_all(&sends)?;
        Ok(())
    }
}

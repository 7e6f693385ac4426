//! Waiting on the CPU: testing and waiting for requests (one, or all of a set under one
//! deadline), and how a wait notices a failed peer by the clock rather than by a count of
//! spins.

use super::requests::{Request, Status};
use super::Comm;
use crate::fault::Cause;
use gdsync::{Error, Result};
use std::time::{Duration, Instant};

impl Comm {
    /// Releases `r` if it finished: `Ok(Some(bytes))`, or its error.
    pub(super) fn finish(&mut self, r: Request) -> Result<Option<u32>> {
        if let Some(i) = self.chunk_index(r) {
            return self.finish_chunked(i);
        }
        if let Status::Done(n) = self.state(r)?.status {
            // A staged receive's bytes reach the GPU before the request says so: by the
            // executor that copies them (once its mark says it did), else by the CPU now.
            if self.stage_exec_copy_outstanding(r) {
                return Ok(None);
            }
            self.stage_cpu_copy_in(r, n)?;
        }
        let st = self.state(r)?;
        match st.status {
            Status::Pending => Ok(None),
            Status::Done(n) => {
                st.live = false;
                self.free.push(r.slot);
                Ok(Some(n))
            }
            Status::Failed(s) => {
                let (peer, work) = (st.peer, st.work);
                st.live = false;
                self.free.push(r.slot);
                if matches!(
                    s,
                    gdsync::format::Syndrome::TransportRetryExc | gdsync::format::Syndrome::WrFlush
                ) {
                    // The work failed because the connection had: say why it did.
                    let me = self.rank;
                    let p = self.peers.get_mut(peer)?;
                    let qpn = p.qp.qpn();
                    p.note(
                        me,
                        peer,
                        Cause::Completion {
                            syndrome: s,
                            work,
                            qpn,
                        },
                    );
                    return Err(self.connection_error(peer, &work.describe(peer)));
                }
                // The wr_id is internal (a request's slot): not one the user could match.
                Err(Error::Completion {
                    wr_id: u64::MAX,
                    qpn: self.peers.find(peer).map_or(0, |p| p.qp.qpn()),
                    syndrome: s,
                })
            }
        }
    }

    /// Whether `r` is complete; `Ok(Some(bytes))` releases it (bytes received, for receives).
    pub fn test(&mut self, r: Request) -> Result<Option<u32>> {
        // A request already known complete (an earlier call's progress saw it) costs no
        // progress pass.
        if let Some(n) = self.finish(r)? {
            return Ok(Some(n));
        }
        self.progress()?;
        self.finish(r)
    }

    /// Waits for `r` on the CPU; returns the bytes received (receives) and releases it.
    /// A request already known complete returns at once; else polls `r`'s peer first, and
    /// every peer now and then (queued work to others moves on).
    pub fn wait(&mut self, r: Request) -> Result<u32> {
        self.wait_until(r, Instant::now() + self.timeout)
    }

    /// [`wait`](Self::wait) with a deadline (shared by the requests of one `wait_all`).
    fn wait_until(&mut self, r: Request, deadline: Instant) -> Result<u32> {
        let (peer, side) = {
            let st = self.state(r)?;
            (st.peer, st.side)
        };
        // A request already done (a send waited for behind others) costs no poll.
        if let Some(n) = self.finish(r)? {
            return Ok(n);
        }
        let mut spins = 0u32;
        let mut look = Look::default();
        loop {
            if spins % 64 == 63 {
                self.progress()?;
            } else {
                // Between full passes (the first spin is not one) only the queue `r`
                // completes on: each empty poll of a soft device's CQ also runs a round of its
                // engine.
                self.pump(peer)?;
                self.poll_peer_sides(peer, &[side])?;
            }
            if let Some(n) = self.finish(r)? {
                return Ok(n);
            }
            spins += 1;
            // Checks by the clock, not by a count of spins: on a loaded machine a spin may
            // take a millisecond, and a dead peer must still be noticed at once.
            let due = spins % 64 == 0 && look.due();
            if due && self.failed_peer([peer]).is_some() {
                // What the peer sent before it failed may still be on its way: a short grace.
                if let Some(n) = self.progress_within(FAULT_GRACE, |c| c.finish(r))? {
                    return Ok(n);
                }
                let work = self.state(r)?.work;
                self.release(r);
                return Err(self.connection_error(peer, &work.describe(peer)));
            }
            if due && Instant::now() > deadline {
                let side = self.state(r)?.side;
                let what = format!(
                    "{side:?} request with rank {peer} (its peer never matched it?); {}",
                    self.describe_peer(peer)
                );
                return Err(Error::Timeout {
                    what,
                    timeout_ms: self.timeout.as_millis() as u64,
                });
            }
            // Spin first (a yield is a system call, dearer than a short wait), then let
            // other threads run.
            if spins < 256 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Waits for every request; the first error is returned after all were waited for.
    /// The timeout bounds the whole call, not each request.
    pub fn wait_all(&mut self, rs: &[Request]) -> Result<Vec<u32>> {
        let deadline = Instant::now() + self.timeout;
        let mut out = Vec::with_capacity(rs.len());
        let mut first = None;
        for &r in rs {
            match self.wait_until(r, deadline) {
                Ok(n) => out.push(n),
                Err(e) => {
                    out.push(0);
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(out), Err)
    }

    /// Makes progress until `done` gives a value or `grace` passes (a departed peer's last
    /// messages may still be on their way).
    pub(super) fn progress_within<T>(
        &mut self,
        grace: Duration,
        mut done: impl FnMut(&mut Self) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let until = Instant::now() + grace;
        while Instant::now() < until {
            self.progress()?;
            if let Some(v) = done(self)? {
                return Ok(Some(v));
            }
            std::thread::yield_now();
        }
        Ok(None)
    }
}

/// How long a wait goes on after its peer failed or left the job: what the peer sent before
/// may still be on its way.
pub(super) const FAULT_GRACE: Duration = Duration::from_millis(50);

/// When a waiting loop looks again at what it cannot learn from its queues (peers that left,
/// its deadline): every millisecond by the clock, however long a spin takes.
pub(super) struct Look {
    next: Instant,
}

impl Default for Look {
    fn default() -> Self {
        Self {
            next: Instant::now(),
        }
    }
}

impl Look {
    const EVERY: Duration = Duration::from_millis(1);

    /// Whether it is time to look (and, if so, the next look is due a millisecond later).
    pub(super) fn due(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        self.next = now + Self::EVERY;
        true
    }
}

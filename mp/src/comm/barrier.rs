//! Barriers: a dissemination barrier through RDMA writes into each partner's control
//! region, waited for on the CPU or run entirely by an executor.

use super::wait::{Look, FAULT_GRACE};
use super::{Comm, INTERNAL};
use gdsync::exec::Executor;
use gdsync::ops::{Ops, WaitCond};
use gdsync::{Error, Result, SendWr};
use std::time::Instant;

impl Comm {
    /// A dissemination barrier through RDMA writes: round k writes this rank's epoch into
    /// rank (me + 2^k)'s word for round k and waits for rank (me - 2^k)'s. Returns, per
    /// round, the partner, the write and the local word to wait on. The writes are signalled
    /// where an executor commits them (`on_exec`): its completion tells the CPU the commit
    /// was rung (`Ringers::Executors`).
    fn barrier_steps(&mut self, epoch: u64, on_exec: bool) -> Vec<(usize, SendWr, usize)> {
        let mut steps = Vec::new();
        for (k, to) in self.barrier_partners() {
            let at = self.remote_ctrl[to].at(self.layout.barrier(k) as u64);
            self.scratch_mr.write_at(8 + 8 * k, &epoch.to_ne_bytes());
            let wr = SendWr::write(at)
                .sge(self.scratch_mr.sge(8 + 8 * k..16 + 8 * k))
                .inline()
                .wr_id(INTERNAL);
            let wr = if on_exec { wr } else { wr.unsignaled() };
            steps.push((to, wr, self.layout.barrier(k)));
        }
        steps
    }

    /// Each round and the rank it writes to (rank me + 2^k); rounds that would write to this
    /// rank (a communicator of one) are left out.
    fn barrier_partners(&self) -> Vec<(usize, usize)> {
        (0..self.layout.rounds)
            .map(|k| (k, (self.rank + (1 << k)) % self.size))
            .filter(|&(_, to)| to != self.rank)
            .collect()
    }

    fn barrier_word(&self, k: usize) -> u64 {
        let mut b = [0u8; 8];
        self.ctrl.read_at(self.layout.barrier(k), &mut b);
        u64::from_ne_bytes(b)
    }

    /// Barrier on the CPU. Its writes go in order with other work to each peer.
    pub fn barrier(&mut self) -> Result<()> {
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let start = Instant::now();
        for (k, (to, wr, _)) in self.barrier_steps(epoch, false).into_iter().enumerate() {
            // The write is inline: its bytes are copied when posted, so the scratch word
            // may be reused by the next round even while this write is still queued.
            self.post_cpu(to, None, vec![wr], None)?;
            let from = (self.rank + self.size - (1 << k) % self.size) % self.size;
            let mut spins = 0u32;
            let mut look = Look::default();
            // A round ends once the partner arrived and this rank's own write has left its
            // queue (behind executor work it waits for that work's completion): a rank that
            // left with its write still queued would hold its partner up for ever.
            while self.barrier_word(k) < epoch || self.queued(to)? {
                self.progress()?;
                spins += 1;
                // Any rank that failed holds the barrier up, directly or through the ranks
                // that wait for it.
                if spins % 64 == 0 && look.due() {
                    if let Some(failed) = self.failed_peer(0..self.size) {
                        if self
                            .progress_within(FAULT_GRACE, |c| {
                                Ok((c.barrier_word(k) >= epoch).then_some(()))
                            })?
                            .is_none()
                        {
                            let what = format!("barrier round {k} (waiting for rank {from})");
                            return Err(self.connection_error(failed, &what));
                        }
                    }
                }
                if start.elapsed() > self.timeout {
                    let what = if self.barrier_word(k) < epoch {
                        format!("barrier round {k}: rank {from} did not arrive (it stopped, or does not call barrier)")
                    } else {
                        format!("barrier round {k}: the write to rank {to} stayed queued behind executor work that never completed (is a stream holding it?)")
                    };
                    return Err(Error::Timeout {
                        what,
                        timeout_ms: self.timeout.as_millis() as u64,
                    });
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Whether CPU work to `peer` is still queued (not yet posted).
    fn queued(&self, peer: usize) -> Result<bool> {
        Ok(!self.peers.get(peer)?.pending.is_empty())
    }

    /// Barrier on an executor: the writes and waits run there, the CPU does not wait.
    pub fn barrier_on(&mut self, exec: &impl Executor) -> Result<()> {
        for (_, to) in self.barrier_partners() {
            self.no_queued_cpu_work(to, "a barrier on an executor")?;
        }
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let mut ops = Ops::new();
        for (to, wr, word) in self.barrier_steps(epoch, true) {
            let p = self.peers.get_mut(to)?;
            let prepared = p.qp.prepare_send(&wr)?;
            let (t, commit) = p.qp.commit(prepared)?;
            p.exec_end = Some(t.end);
            ops.append(commit);
            // The wait keeps the control buffer alive, so the `Comm` may go first.
            ops.append(self.ctrl.wait64(word, epoch, WaitCond::Geq));
        }
        exec.submit(ops)
    }
}

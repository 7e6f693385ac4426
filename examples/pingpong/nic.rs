//! The soft device's wire: one RC queue pair per rank, RDMA write (the receiver polls the
//! last byte), write with immediate or send (the receiver polls its completion queue).

use super::wire::{leak, marker, relax, Wire};
use super::Op;
use anyhow::{bail, Context, Result};
use gdasync::gdsync::{
    Access, Cq, Device, Endpoint, MemoryRegion, Qp, QpConfig, RecvWr, RemoteBuf, SendWr, WrOp,
};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

/// How long a rank waits for one message before it gives up.
const WAIT_LIMIT: Duration = Duration::from_secs(10);

pub(crate) struct Nic {
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    sbuf: MemoryRegion<'static>,
    rbuf: MemoryRegion<'static>,
    remote: RemoteBuf,
    op: Op,
    inline_max: usize,
    posted: u64,
    signal_every: u64,
    unacked_signals: u64,
    /// This size's work requests, unsignalled and signalled, built once per size as perftest
    /// builds its own (a message changes only the immediate).
    wrs: [SendWr; 2],
    _dev: Device,
}

/// A rank's queues and buffers before the connection.
pub(crate) struct NicSetup {
    dev: Device,
    pub(crate) qp: Qp,
    scq: Cq,
    rcq: Cq,
    sbuf: MemoryRegion<'static>,
    pub(crate) rbuf: MemoryRegion<'static>,
}

impl NicSetup {
    pub(crate) fn new(dev: &Device, max: usize) -> Result<NicSetup> {
        let dev = dev.clone();
        let pd = dev.alloc_pd();
        let scq = dev.create_cq(1024)?;
        let rcq = dev.create_cq(1024)?;
        let qp = pd.create_qp(&scq, &rcq, &QpConfig::default())?;
        let sbuf = pd.register(leak(max), Access::LOCAL_WRITE)?;
        let rbuf = pd.register(leak(max), Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        Ok(NicSetup {
            dev,
            qp,
            scq,
            rcq,
            sbuf,
            rbuf,
        })
    }

    /// What the peer needs: the endpoint and the receive buffer, as one line.
    pub(crate) fn card(&self) -> String {
        let r = self.rbuf.remote();
        format!(
            "{} {:x} {:x} {:x}",
            self.qp.endpoint(),
            r.addr,
            r.len,
            r.rkey
        )
    }

    /// Connects to the peer whose [`NicSetup::card`] is `card`.
    pub(crate) fn connect_card(self, card: &str, op: Op) -> Result<Nic> {
        let bad = || format!("bad connection card from the peer: {card:?}");
        let mut it = card.split_whitespace();
        let ep: Endpoint = it.next().with_context(bad)?.parse().with_context(bad)?;
        let mut num = || -> Result<u64> {
            u64::from_str_radix(it.next().with_context(bad)?, 16).with_context(bad)
        };
        let remote = RemoteBuf {
            addr: num()?,
            len: num()?,
            rkey: u32::try_from(num()?).with_context(bad)?,
        };
        self.connect(&ep, remote, op)
    }

    pub(crate) fn connect(mut self, peer: &Endpoint, remote: RemoteBuf, op: Op) -> Result<Nic> {
        if let Ok(link) = self.dev.link_kind(peer) {
            tracing::debug!(?link, qpn = self.qp.qpn(), "pingpong: connecting");
        }
        self.qp.connect(peer)?;
        let mut n = Nic {
            qp: self.qp,
            scq: self.scq,
            rcq: self.rcq,
            sbuf: self.sbuf,
            rbuf: self.rbuf,
            remote,
            op,
            inline_max: QpConfig::default().max_inline as usize,
            posted: 0,
            signal_every: 64, // a power of two
            unacked_signals: 0,
            wrs: [SendWr::send(), SendWr::send()],
            _dev: self.dev,
        };
        n.build_wrs(1);
        if op != Op::Write {
            for _ in 0..128 {
                n.post_recv()?;
            }
        }
        Ok(n)
    }
}

impl Nic {
    /// The work requests of a message of `size` bytes (see [`Nic::wrs`]).
    fn build_wrs(&mut self, size: usize) {
        let mut wr = match self.op {
            Op::Write => SendWr::write(self.remote.at(0)),
            Op::WriteImm => SendWr::write_imm(self.remote.at(0), 0),
            Op::Send => SendWr::send(),
            // Not a ping-pong: --op read runs on the GPU triggers (read.rs); refused in wait.
            Op::Read => SendWr::read(self.remote.at(0)),
        };
        if size > 0 {
            wr = wr.sge(self.sbuf.sge(..size));
        }
        if size <= self.inline_max {
            wr = wr.inline();
        }
        self.wrs = [wr.clone().unsignaled(), wr];
    }
    fn post_recv(&mut self) -> Result<()> {
        let sge = self.rbuf.sge(..);
        self.qp.post_recv(&RecvWr::new().sge(sge))?;
        Ok(())
    }
    fn reap_sends(&mut self) -> Result<()> {
        while let Some(c) = self.scq.poll_one()? {
            c.ok().context("send completion")?;
            self.unacked_signals -= 1;
        }
        Ok(())
    }
    fn timed_out(&self, i: u64) -> anyhow::Error {
        anyhow::anyhow!(
            "no message {i} after {} s (QP state {:?})",
            WAIT_LIMIT.as_secs(),
            self.qp.state()
        )
    }
}

impl Wire for Nic {
    fn send(&mut self, i: u64, size: usize) -> Result<()> {
        if size > 0 {
            self.sbuf.write_volatile_u8(size - 1, marker(i));
        }
        self.posted += 1;
        let signalled = self.posted & (self.signal_every - 1) == 0;
        if signalled {
            self.unacked_signals += 1;
        }
        let wr = &mut self.wrs[signalled as usize];
        if let WrOp::WriteImm(_, imm) = &mut wr.op {
            *imm = i as u32;
        }
        // Keep at most two signalled sends in flight so the ring never fills.
        while self.unacked_signals > 2 {
            self.reap_sends()?;
        }
        self.qp.post_send(&self.wrs[signalled as usize])?;
        if self.unacked_signals > 0 {
            self.reap_sends()?;
        }
        Ok(())
    }

    fn wait(&mut self, i: u64, size: usize) -> Result<()> {
        let start = Instant::now();
        let mut spins = 0u32;
        match self.op {
            Op::Write => {
                if size == 0 {
                    bail!("--op write needs a size of at least 1 byte (the receiver polls the last byte)");
                }
                let m = marker(i);
                while self.rbuf.read_volatile_u8(size - 1) != m {
                    spins += 1;
                    if spins % 4096 == 0 && start.elapsed() > WAIT_LIMIT {
                        return Err(self.timed_out(i));
                    }
                    relax(spins);
                }
                fence(Ordering::Acquire);
                Ok(())
            }
            Op::Read => bail!("--op read runs with --trigger stream or kernel"),
            Op::WriteImm | Op::Send => {
                // Busy-poll, as perftest does (Cq::wait_one backs off to sleeping).
                let c = loop {
                    if let Some(c) = self.rcq.poll_one()? {
                        break c.ok()?;
                    }
                    spins += 1;
                    if spins % 4096 == 0 && start.elapsed() > WAIT_LIMIT {
                        return Err(self.timed_out(i));
                    }
                    relax(spins);
                };
                if c.byte_len as usize != size {
                    bail!("received {} bytes, expected {size}", c.byte_len);
                }
                self.post_recv()
            }
        }
    }

    fn reset(&mut self, size: usize) -> Result<()> {
        self.rbuf.write_at(0, &vec![0u8; size]);
        self.build_wrs(size);
        Ok(())
    }
}

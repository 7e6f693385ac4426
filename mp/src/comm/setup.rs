//! Making a communicator: the ranks learn whether they span hosts, each creates its QPs to
//! every peer and registers its control region, the connection records go around through
//! the bootstrap, and every QP is connected before anyone sends.

use super::peers::{Peer, Peers};
use super::wire::{check_gathered, decode_setup, encode_setup};
use super::{Comm, CtrlLayout};
use crate::bootstrap::Bootstrap;
use gdsync::{
    Access, Device, Error, MemoryRegion, PinnedBuffer, ProtectionDomain, QpConfig, RemoteBuf,
    Result, Ringers,
};
use std::time::{Duration, Instant};

/// Logs a bootstrap failure during set-up (the ranks it waits for are the likely culprits)
/// and passes the error on.
fn bootstrap_failed(rank: usize, during: &str, e: Error) -> Error {
    tracing::error!("rank {rank}: bootstrap failed while {during}: {e}");
    e
}

/// Makes this process accept soft-device TCP links when the ranks span hosts (found in one
/// bootstrap round of host ids), on the address the bootstrap reaches the other ranks from
/// (all interfaces if it cannot tell). Ranks on one host link through memory, and their
/// processes listen on no interface.
fn listen_if_ranks_span_hosts(boot: &mut dyn Bootstrap, rank: usize, size: usize) -> Result<()> {
    let mine = gdsync::host_id().to_le_bytes();
    let all = boot
        .all_gather(&mine)
        .map_err(|e| bootstrap_failed(rank, "exchanging host ids", e))?;
    check_gathered(&all, size)?;
    if all.iter().all(|h| h[..] == mine) {
        return Ok(());
    }
    let ip = boot
        .local_ip()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
    let addr = gdsync::accept_tcp_links(Some(ip))?;
    tracing::debug!(
        "rank {rank}: the ranks span hosts: soft-device TCP links are accepted at {addr}"
    );
    Ok(())
}

/// Registers the control region (peers write credits and barrier words into it) and the
/// scratch words (sources of barrier writes, targets of credit fetch-and-adds).
///
/// # Safety
/// `ctrl` and `scratch` must outlive the registrations (the `Comm` declares the buffers
/// after them, so it drops them after them).
unsafe fn register_ctrl(
    pd: &ProtectionDomain,
    ctrl: &PinnedBuffer,
    scratch: &PinnedBuffer,
) -> Result<(MemoryRegion<'static>, MemoryRegion<'static>)> {
    // SAFETY: the caller keeps the buffers alive for as long as the registrations.
    let ctrl_mr = unsafe {
        pd.register_raw(
            ctrl.addr() as *mut u8,
            ctrl.len(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
        )?
    };
    // SAFETY: as above.
    let scratch_mr = unsafe {
        pd.register_raw(
            scratch.addr() as *mut u8,
            scratch.len(),
            Access::LOCAL_WRITE,
        )?
    };
    Ok((ctrl_mr, scratch_mr))
}

/// Per peer of rank `rank`, one QP for traffic (own send and receive CQs, so completions can
/// be waited for on executors) and one for credits.
fn create_peers(dev: &Device, pd: &ProtectionDomain, rank: usize, size: usize) -> Result<Peers> {
    // Executors' commits store no "rung to" after their doorbells (on a stream, one ordered
    // store less per send): the CPU learns that they are rung from their completions, so
    // every commit ends with a signalled work request, and CPU work queued behind one waits
    // for its completion (`pump`).
    let cfg = QpConfig {
        send_wqebbs: 1024,
        recv_wqes: 512,
        ringers: Ringers::Executors,
        ..QpConfig::default()
    };
    let ctl_cfg = QpConfig {
        send_wqebbs: 256,
        recv_wqes: 1,
        ..QpConfig::default()
    };
    let mut peers = Vec::with_capacity(size);
    for p in 0..size {
        if p == rank {
            peers.push(None);
            continue;
        }
        let (scq, rcq) = (dev.create_cq(2048)?, dev.create_cq(1024)?);
        let qp = pd.create_qp(&scq, &rcq, &cfg)?;
        let ctl_cq = dev.create_cq(64)?;
        let ctl = pd.create_qp(&ctl_cq, &ctl_cq, &ctl_cfg)?;
        peers.push(Some(Peer::new(qp, scq, rcq, ctl, ctl_cq)));
    }
    Ok(Peers::new(rank, peers))
}

/// Exchanges connection records through `boot` (this rank's control region `ctrl` and the
/// endpoints of its QPs) and connects both QPs to every peer; returns every rank's control
/// region.
fn connect_peers(
    boot: &mut dyn Bootstrap,
    rank: usize,
    size: usize,
    peers: &mut Peers,
    ctrl: &RemoteBuf,
) -> Result<Vec<RemoteBuf>> {
    let all = boot
        .all_gather(&encode_setup(&peers.endpoints(), 2, ctrl))
        .map_err(|e| bootstrap_failed(rank, "exchanging connection records", e))?;
    check_gathered(&all, size)?;
    let mut remote_ctrl = Vec::with_capacity(size);
    for (p, rec) in all.iter().enumerate() {
        let (c, mut their_eps) = decode_setup(rec, size, 2)?;
        remote_ctrl.push(c);
        if p == rank {
            continue;
        }
        let eps = their_eps[rank].take().ok_or_else(|| {
            Error::invalid(format!(
                "bootstrap: rank {p}'s connection record has no QP for rank {rank} (do the ranks agree on the size?)"
            ))
        })?;
        let peer = peers.get_mut(p)?;
        peer.qp.connect(&eps[0])?;
        peer.ctl.connect(&eps[1])?;
        tracing::debug!(
            "rank {rank}: connected to rank {p}: traffic QP {:#x} -> {:#x}, credit QP {:#x} -> {:#x}",
            peer.qp.qpn(),
            eps[0].qpn,
            peer.ctl.qpn(),
            eps[1].qpn
        );
    }
    Ok(remote_ctrl)
}

impl Comm {
    /// Creates the communicator on `dev`: per peer one QP for traffic (own send and receive
    /// CQs, so completions can be waited for on executors) and one for credits, connected
    /// through `boot`. Collective.
    pub fn new(mut boot: Box<dyn Bootstrap>, dev: &Device) -> Result<Comm> {
        let (rank, size) = (boot.rank(), boot.size());
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} out of range for size {size}"
            )));
        }
        let start = Instant::now();
        tracing::debug!(
            "rank {rank} of {size}: setting up a communicator on {} (bootstrap: {})",
            dev.info().name,
            boot.describe()
        );
        listen_if_ranks_span_hosts(&mut *boot, rank, size)?;
        let pd = dev.alloc_pd();
        let rounds = usize::BITS as usize - (size.max(2) - 1).leading_zeros() as usize;
        let layout = CtrlLayout { size, rounds };
        let ctrl = PinnedBuffer::new(layout.bytes());
        let scratch = PinnedBuffer::new(8 * (1 + rounds));
        // SAFETY: the buffers are owned by the Comm and outlive the registrations (declared
        // after them, so dropped after them).
        let (ctrl_mr, scratch_mr) = unsafe { register_ctrl(&pd, &ctrl, &scratch)? };
        let mut peers = create_peers(dev, &pd, rank, size)?;
        let remote_ctrl = connect_peers(&mut *boot, rank, size, &mut peers, &ctrl_mr.remote())?;
        // Everyone is connected before anyone sends.
        boot.barrier()
            .map_err(|e| bootstrap_failed(rank, "waiting for every rank to connect", e))?;
        tracing::info!(
            "rank {rank} of {size}: communicator ready on {}, connected to {} peer{} in {:.1} ms (bootstrap: {})",
            dev.info().name,
            size - 1,
            if size == 2 { "" } else { "s" },
            start.elapsed().as_secs_f64() * 1e3,
            boot.describe()
        );
        Ok(Comm {
            rank,
            size,
            peers,
            reqs: Vec::new(),
            free: Vec::new(),
            layout,
            polled: Vec::with_capacity(64),
            _ctrl_mr: ctrl_mr,
            scratch_mr,
            ctrl,
            _scratch: scratch,
            remote_ctrl,
            barrier_epoch: 0,
            timeout: Duration::from_secs(60),
            regs: Default::default(),
            stage: None,
            stage_shape: Default::default(),
            chunked: Vec::new(),
            pd,
            dev: dev.clone(),
            boot,
        })
    }
}

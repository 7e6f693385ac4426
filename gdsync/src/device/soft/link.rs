//! Links between soft-device engines: the "wire". A link is a pair of byte rings
//! ([`ring`](super::ring), one per direction) carrying packets ([`wire`](super::wire)), in
//! one process (heap memory) or between processes on one host (a shared-memory file,
//! [`shm_link`](super::shm_link)). A loopback link is one ring the engine writes and reads. A
//! bridged link is a heap pair whose far half is served by transport threads instead of a
//! peer engine (the TCP link, [`super::tcp`]). This file holds an engine's end of a link:
//! what it shares with an in-process peer, and how it learns that the other end is gone.

use super::bridge::BridgeSignal;
use super::mr_table::MrTable;
use super::ring::{Consumer, Mapping, Producer};
use super::targets::WriteTargets;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long `connect` waits for the peer's half of a link (its shared-memory file, its TCP
/// dial): the peer calls `connect` at about the same time, but may be slow to start.
pub(crate) const PEER_WAIT: Duration = Duration::from_secs(30);
/// The ends' closed flags in the mapping's first page: two u32, one per side.
const OFF_CLOSED: usize = 64;

/// How an engine learns that the other end is gone.
pub(super) enum Liveness {
    /// Loopback: the peer is this engine.
    Loopback,
    /// Same process: the peer's closed flag.
    InProcess,
    /// Another process: the closed flag, and a pidfd that turns readable when it exits.
    Process { pid: u32, pidfd: Option<OwnedFd> },
    /// A transport (TCP): its threads report a failed or closed connection.
    Bridged(Arc<BridgeSignal>),
}

/// The far half of a bridged link, for the transport threads: `outbound` reads the packets
/// the engine sends, `inbound` writes the packets the engine receives.
pub(crate) struct BridgeEnd {
    pub outbound: Consumer,
    pub inbound: Producer,
    pub signal: Arc<BridgeSignal>,
}

/// One engine's end of a link.
pub(crate) struct Link {
    pub peer: u64,
    /// Both ends of a link between two devices of this process share this id, which no
    /// other link of the process ever had or will have (0 on other links): the identity a
    /// direct write's origin is checked by, as a packet's is by the link it arrives on.
    pub pair_id: u64,
    pub tx: Producer,
    pub rx: Consumer,
    map: Arc<Mapping>,
    side: usize,
    live: Liveness,
    next_check: Instant,
    pub dead: bool,
    /// The peer device's region table, where both devices live in this process: large
    /// payloads then go by reference and are copied once, from the sender's memory.
    peer_regions: Option<Arc<MrTable>>,
    /// The peer device's QPs that take direct writes, where both devices live in this
    /// process.
    peer_targets: Option<Arc<WriteTargets>>,
}

/// What a device of this process shares with the devices it links to: its region table (for
/// payloads by reference) and the QPs that take direct writes.
#[derive(Clone)]
pub(crate) struct DeviceShare {
    pub regions: Arc<MrTable>,
    pub targets: Arc<WriteTargets>,
}

impl Link {
    /// Whether the far end is this engine itself.
    pub(crate) fn is_loopback(&self) -> bool {
        matches!(self.live, Liveness::Loopback)
    }

    /// Whether the receive ring is filled by this process's bridge thread from a transport
    /// (TCP), not by the peer engine's core.
    pub(crate) fn is_bridged(&self) -> bool {
        matches!(self.live, Liveness::Bridged(_))
    }

    pub(crate) fn loopback(uid: u64) -> Self {
        let map = Arc::new(Mapping::heap(Mapping::size_for(1)));
        Self::new(uid, &map, 0, 0, 0, Liveness::Loopback)
    }

    /// The two ends of a link between devices `a` and `b` of this process, with what each
    /// shares (`a_share` is `a`'s).
    pub(crate) fn in_process_pair(
        (a, a_share): (u64, &DeviceShare),
        (b, b_share): (u64, &DeviceShare),
    ) -> (Self, Self) {
        // 64 bits counted up: never wraps, so an id is never used again.
        static PAIRS: AtomicU64 = AtomicU64::new(0);
        let pair_id = PAIRS.fetch_add(1, Ordering::Relaxed) + 1;
        let map = Arc::new(Mapping::heap(Mapping::size_for(2)));
        let mut ends = (
            Self::new(b, &map, 0, 0, 1, Liveness::InProcess),
            Self::new(a, &map, 1, 1, 0, Liveness::InProcess),
        );
        ends.0.pair_id = pair_id;
        ends.1.pair_id = pair_id;
        ends.0.peer_regions = Some(b_share.regions.clone());
        ends.1.peer_regions = Some(a_share.regions.clone());
        ends.0.peer_targets = Some(b_share.targets.clone());
        ends.1.peer_targets = Some(a_share.targets.clone());
        ends
    }

    /// The peer device's QPs that take direct writes, on a link within this process.
    pub(crate) fn peer_targets(&self) -> Option<&Arc<WriteTargets>> {
        self.peer_targets.as_ref()
    }

    /// The peer device's region table, on a link within this process.
    pub(crate) fn peer_regions(&self) -> Option<&Arc<MrTable>> {
        self.peer_regions.as_ref()
    }

    /// Lends the peer device's region table out of the link (moved, not cloned: no count to
    /// update for each packet) until [`return_peer_regions`](Self::return_peer_regions).
    pub(crate) fn lend_peer_regions(&mut self) -> Option<Arc<MrTable>> {
        self.peer_regions.take()
    }

    /// Takes back the table [`lend_peer_regions`](Self::lend_peer_regions) lent.
    pub(crate) fn return_peer_regions(&mut self, table: Option<Arc<MrTable>>) {
        self.peer_regions = table;
    }

    /// A link to device `peer` whose far half is served by transport threads: the engine
    /// sends on ring 0 (the threads' `outbound`) and receives on ring 1 (their `inbound`).
    pub(crate) fn bridged(peer: u64) -> (Self, BridgeEnd) {
        let map = Arc::new(Mapping::heap(Mapping::size_for(2)));
        let signal = Arc::new(BridgeSignal::default());
        let mut link = Self::new(peer, &map, 0, 0, 1, Liveness::Bridged(signal.clone()));
        link.tx.notify(signal.clone());
        #[cfg(test)]
        super::bridge::bridges::note(peer, &signal);
        let end = BridgeEnd {
            outbound: Consumer::new(&map, 0),
            inbound: Producer::new(&map, 1),
            signal,
        };
        (link, end)
    }

    /// An end of the rings `tx` and `rx` of `map`, on side `side` of its closed flags.
    pub(super) fn new(
        peer: u64,
        map: &Arc<Mapping>,
        side: usize,
        tx: usize,
        rx: usize,
        live: Liveness,
    ) -> Self {
        Self {
            peer,
            pair_id: 0,
            tx: Producer::new(map, tx),
            rx: Consumer::new(map, rx),
            map: map.clone(),
            side,
            live,
            next_check: Instant::now(),
            dead: false,
            peer_regions: None,
            peer_targets: None,
        }
    }

    /// Checks (at most every few milliseconds) whether the other end is gone.
    pub(crate) fn check_alive(&mut self, now: Instant) -> bool {
        if self.dead || now < self.next_check {
            return !self.dead;
        }
        self.next_check = now + Duration::from_millis(5);
        let closed = self.peer_closed();
        let gone = match &self.live {
            Liveness::Loopback => false,
            Liveness::InProcess => closed,
            Liveness::Process { pid, pidfd } => closed || process_gone(*pid, pidfd.as_ref()),
            Liveness::Bridged(s) => s.is_down(),
        };
        self.dead = gone;
        !gone
    }

    /// Whether the other end closed the link (its device was dropped).
    pub(crate) fn peer_closed(&self) -> bool {
        self.map
            .u32(OFF_CLOSED + 4 * (1 - self.side))
            .load(Ordering::Acquire)
            != 0
    }

    /// Whether the other end is another process's device that closed the link in order (its
    /// process dropped the device or exited cleanly).
    pub(crate) fn peer_process_closed(&self) -> bool {
        matches!(self.live, Liveness::Process { .. }) && self.peer_closed()
    }

    /// Why a dead link died, for the log.
    pub(crate) fn down_reason(&self) -> String {
        let closed = self.peer_closed();
        match &self.live {
            Liveness::Loopback => "loopback".into(),
            Liveness::InProcess => "the peer device was dropped".into(),
            Liveness::Process { pid, .. } if closed => {
                format!("process {pid} dropped the peer device")
            }
            Liveness::Process { pid, .. } => format!("process {pid} exited"),
            Liveness::Bridged(_) => "the TCP connection closed or failed".into(),
        }
    }
}

/// Whether process `pid` has ended or is ending. A killed process is readable on its pidfd
/// only once its exit completes, which can take seconds when the kernel tears down device
/// state (a GPU context); its `PF_EXITING` flag in `/proc/<pid>/stat` is set at the start.
pub(super) fn process_gone(pid: u32, pidfd: Option<&OwnedFd>) -> bool {
    if let Some(fd) = pidfd {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        if r > 0 && p.revents & libc::POLLIN != 0 {
            return true;
        }
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => stat_says_exiting(&s),
        // No such process (reaped), unless pidfds say otherwise: then trust them.
        Err(_) => pidfd.is_none(),
    }
}

/// Reads `/proc/<pid>/stat`: a zombie or dead state, or the `PF_EXITING` flag.
fn stat_says_exiting(stat: &str) -> bool {
    const PF_EXITING: u64 = 0x4;
    // The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("");
    // Field 9, flags: the sixth after the state.
    let flags = fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0
}

impl Drop for Link {
    fn drop(&mut self) {
        self.map
            .u32(OFF_CLOSED + 4 * self.side)
            .store(1, Ordering::Release);
        if let Liveness::Bridged(s) = &self.live {
            s.engine_dropped();
        }
    }
}

#[cfg(test)]
mod liveness_tests {
    use super::*;

    #[test]
    fn only_the_ends_of_an_in_process_link_name_the_peer_device_tables() {
        let share = || DeviceShare {
            regions: Arc::new(MrTable::default()),
            targets: Arc::new(WriteTargets::new(16)),
        };
        let (sa, sb) = (share(), share());
        let (a, b) = Link::in_process_pair((1, &sa), (2, &sb));
        // `a` is device 1's end: it receives device 2's packets and reads device 2's regions.
        assert_eq!(a.peer, 2);
        assert!(a
            .peer_regions()
            .is_some_and(|t| Arc::ptr_eq(t, &sb.regions)));
        assert!(b
            .peer_regions()
            .is_some_and(|t| Arc::ptr_eq(t, &sa.regions)));
        assert!(a
            .peer_targets()
            .is_some_and(|t| Arc::ptr_eq(t, &sb.targets)));
        assert!(b
            .peer_targets()
            .is_some_and(|t| Arc::ptr_eq(t, &sa.targets)));
        for far in [Link::loopback(3), Link::bridged(4).0] {
            assert!(far.peer_regions().is_none() && far.peer_targets().is_none());
        }
    }

    #[test]
    fn proc_stat_states_and_the_exiting_flag() {
        // pid (comm) state ppid pgrp session tty tpgid flags ...
        let live = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0";
        assert!(!stat_says_exiting(live));
        assert!(stat_says_exiting("42 (x) Z 1 42 42 0 -1 4194560 1 0"));
        assert!(stat_says_exiting("42 (x) R 1 42 42 0 -1 4194564 1 0"));
        assert!(!stat_says_exiting("garbage"));
        let me = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(!stat_says_exiting(&me), "{me}");
    }
}

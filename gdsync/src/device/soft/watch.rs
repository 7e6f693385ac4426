//! What a waiting thread looks at before it runs a soft engine's round: the engine's watch.
//!
//! In shared progress a rank that waits for a message calls into the engine between looks at
//! its own memory. A full round takes the engine's lock and visits every QP and link; most
//! such calls find nothing, and the time they take is time before the rank's next look. So
//! after a round that found nothing and left nothing pending, the engine publishes what it
//! saw: each QP's doorbell register as last read, each link's receive position, and the
//! region table version it works from. A waiting thread compares those with memory, without
//! the lock, and runs a round only when something differs (or a command, a timer tick or a
//! doorbell's hand-over is asked for).
//!
//! Every watched event stays visible until the engine handles it (a record's stamp, a
//! doorbell's value), so a look that reads a value from one round and another from the next
//! can at worst miss an event once: the following look sees it. A round that does anything
//! clears `settled` first thing after, and only an idle round sets it again.

use super::mr_table::MrTable;
use super::ring::RxProbe;
use super::uar::{Bfreg, Doorbell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The engine's state as its last idle round left it, for looks from outside its lock.
pub(crate) struct Watch {
    /// The last round found nothing to do and nothing pending (no owed ACK, queued packet,
    /// stalled or failing QP): while the watched words are unchanged, a round would find
    /// nothing either.
    settled: AtomicBool,
    doorbells: Box<[DoorbellProbe]>,
    wires: Box<[WireProbe]>,
    regions: Arc<MrTable>,
    /// The region table version the engine works from (a deregistration waits for a round).
    regions_seen: AtomicU64,
}

/// A QP's doorbell registers (their halves) and the values the engine last read there.
struct DoorbellProbe {
    bfreg: Bfreg,
    last: [AtomicU64; super::uar::HALVES],
}

/// A link's receive ring and the position the engine reads next.
struct WireProbe {
    rx: RxProbe,
    pos: AtomicU64,
}

impl Watch {
    /// A watch over nothing yet, unsettled.
    pub(crate) fn empty(regions: Arc<MrTable>) -> Self {
        Self::new(Vec::new(), Vec::new(), regions)
    }

    /// A watch over these doorbell registers (in the engine's order of active QPs) and
    /// receive rings (in its order of links); unsettled until the engine publishes.
    pub(crate) fn new(bfregs: Vec<Bfreg>, rings: Vec<RxProbe>, regions: Arc<MrTable>) -> Self {
        Self {
            settled: AtomicBool::new(false),
            doorbells: bfregs
                .into_iter()
                .map(|bfreg| DoorbellProbe {
                    bfreg,
                    last: Default::default(),
                })
                .collect(),
            wires: rings
                .into_iter()
                .map(|rx| WireProbe {
                    rx,
                    pos: AtomicU64::new(0),
                })
                .collect(),
            regions,
            regions_seen: AtomicU64::new(0),
        }
    }

    /// Publishes an idle round's view: `doorbells` and `positions` in the order the watch was
    /// made with, and the region table version. The engine holds its lock.
    pub(crate) fn settle(
        &self,
        doorbells: impl Iterator<Item = Doorbell>,
        positions: impl Iterator<Item = u64>,
        regions_seen: u64,
    ) {
        for (p, db) in self.doorbells.iter().zip(doorbells) {
            for (last, v) in p.last.iter().zip(db) {
                last.store(v, Ordering::Relaxed);
            }
        }
        for (p, pos) in self.wires.iter().zip(positions) {
            p.pos.store(pos, Ordering::Relaxed);
        }
        self.regions_seen.store(regions_seen, Ordering::Relaxed);
        self.settled.store(true, Ordering::Release);
    }

    /// A round did something: the published view is no longer the engine's.
    #[inline]
    pub(crate) fn unsettle(&self) {
        if self.settled.load(Ordering::Relaxed) {
            self.settled.store(false, Ordering::Release);
        }
    }

    /// Whether a round would find nothing: the engine settled and no watched word moved.
    #[inline]
    pub(crate) fn quiet(&self) -> bool {
        if !self.settled.load(Ordering::Acquire) {
            return false;
        }
        let wire_quiet = |p: &WireProbe| !p.rx.ready_at(p.pos.load(Ordering::Relaxed));
        let bell_quiet = |p: &DoorbellProbe| {
            let b = &p.bfreg;
            (b.halves().iter().zip(&p.last)).all(|(&off, last)| {
                b.page.u64(off).load(Ordering::Acquire) == last.load(Ordering::Relaxed)
            })
        };
        self.wires.iter().all(wire_quiet)
            && self.doorbells.iter().all(bell_quiet)
            && self.regions.version() == self.regions_seen.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::link::Link;
    use super::super::uar::{UarPages, BF_SIZE};
    use super::super::wire::{kind, PktHeader};
    use super::*;
    use crate::provider::{Access, MrMemory, MrSpec};

    /// A watch over one doorbell register and one ring, settled at the state they have now.
    fn settled(link: &Link, bfreg: &Bfreg, regions: &Arc<MrTable>) -> Watch {
        let w = Watch::new(vec![bfreg.clone()], vec![link.rx.probe()], regions.clone());
        assert!(!w.quiet(), "a new watch is unsettled");
        let db = bfreg
            .halves()
            .map(|off| bfreg.page.u64(off).load(Ordering::Relaxed));
        w.settle(
            [db].into_iter(),
            [link.rx.pos()].into_iter(),
            regions.version(),
        );
        w
    }

    #[test]
    fn a_settled_watch_looks_quiet_until_a_watched_word_moves() {
        let link = Link::loopback(1);
        let bfreg = UarPages::default().alloc(7);
        let regions = Arc::new(MrTable::default());
        let w = settled(&link, &bfreg, &regions);
        assert!(w.quiet(), "nothing moved");

        // A doorbell rung on either half.
        for half in [0, BF_SIZE] {
            let w = settled(&link, &bfreg, &regions);
            bfreg
                .page
                .u64(bfreg.off + half)
                .fetch_add(1, Ordering::Relaxed);
            assert!(!w.quiet(), "a doorbell at half {half:#x} went unseen");
        }

        // A doorbell rung on either half of a QP's pair register (a dynamic UAR's other
        // bfreg).
        let paired = Bfreg {
            pair: bfreg.off + super::super::uar::BF_REG_SIZE,
            ..bfreg.clone()
        };
        for half in [0, BF_SIZE] {
            let w = settled(&link, &paired, &regions);
            (paired.page.u64(paired.pair + half)).fetch_add(1, Ordering::Relaxed);
            assert!(!w.quiet(), "a doorbell at pair half {half:#x} went unseen");
        }

        // A record published on a ring (a link of its own: the others stay idle).
        let mut wire = Link::loopback(2);
        let w = settled(&wire, &bfreg, &regions);
        let h = PktHeader {
            kind: kind::REQ,
            ..Default::default()
        };
        assert!(wire.tx.try_push(&h, 8, |b| b.fill(1)).is_some());
        assert!(!w.quiet(), "a record went unseen");

        // A region registered: the engine must take a new copy of the table.
        let w = settled(&link, &bfreg, &regions);
        regions.register(&MrSpec {
            pd: 1,
            addr: 0x1000,
            len: 64,
            access: Access::ALL,
            memory: MrMemory::Host,
        });
        assert!(!w.quiet(), "a table change went unseen");

        // A round that did something.
        let w = settled(&link, &bfreg, &regions);
        w.unsettle();
        assert!(!w.quiet(), "an unsettled watch looked quiet");
    }
}

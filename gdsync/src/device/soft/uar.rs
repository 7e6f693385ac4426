//! The soft device's doorbell pages, laid out as mlx5's UAR pages: 4 KiB each, with the
//! BlueFlame registers ("bfregs") from offset 0x800, 0x200 bytes apart, each made of two
//! 0x100-byte halves that a CPU poster alternates between (libmlx5's `bf.offset ^= bf.size`).
//! Each QP gets a bfreg of its own; the engine watches both halves of the bfregs it handed
//! out. Streams, kernels and the CPU proxy ring the first half, the address `create_qp`
//! returned, as libgdsync and NVSHMEM ring a DEVX UAR.

use crate::cuda::Cuda;
use crate::mem::RingMem;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Size of a UAR page.
pub(crate) const UAR_SIZE: usize = 4096;
/// Offset of the first bfreg in a UAR page (`MLX5_BF_OFFSET`).
pub(crate) const BF_OFFSET: usize = 0x800;
/// Bytes between bfregs (`bf_reg_size`: two BlueFlame buffers).
pub(crate) const BF_REG_SIZE: usize = 0x200;
/// Size of one BlueFlame buffer (`bf.size`): the second half of a bfreg lies this far
/// after the first.
pub(crate) const BF_SIZE: usize = 0x100;
/// Bfregs in a UAR page.
pub(crate) const BFREGS_PER_UAR: usize = 4;

/// The doorbell halves the engine watches for a QP: both halves of its bfreg, then both
/// halves of `pair`.
pub(crate) const HALVES: usize = 4;
/// What a QP's doorbell registers held at one look, in [`Bfreg::halves`] order.
pub(crate) type Doorbell = [u64; HALVES];

/// A QP's doorbell register: the page and the offset of its bfreg's first half.
#[derive(Clone)]
pub(crate) struct Bfreg {
    pub page: Arc<RingMem>,
    pub off: usize,
    /// Another bfreg of the page that may ring the QP (`off` when none): a QP on a dynamic
    /// UAR names only its page, and libmlx5 rings either of the page's two bfregs.
    pub pair: usize,
}

impl Bfreg {
    /// A bfreg of its own at `off` of `page`.
    pub(crate) fn single(page: Arc<RingMem>, off: usize) -> Self {
        Self {
            page,
            off,
            pair: off,
        }
    }

    /// The offsets of the watched halves (a single bfreg's twice).
    pub(crate) fn halves(&self) -> [usize; HALVES] {
        [self.off, self.off + BF_SIZE, self.pair, self.pair + BF_SIZE]
    }

    /// What the watched halves held at one moment ([`at_one_moment`]).
    #[inline]
    pub(crate) fn doorbell(&self) -> Doorbell {
        let regs = self.halves().map(|off| self.page.u64(off));
        at_one_moment(|h| regs[h].load(Ordering::Acquire))
    }
}

/// The halves, loaded one by one with `load` (by their place in [`Bfreg::halves`]), as they
/// stood at one moment. A ConnectX takes doorbells one after the other, in the order they
/// were written, whichever halves (and bfregs) they land in; loads one after the other are
/// not one moment: a half loaded before an earlier doorbell and another loaded after a later
/// one would show the later doorbell alone, and the earlier one, seen at the next look, would
/// seem to go backwards (the strict checks refuse that). So every half but the last loaded
/// is loaded again: each then held its value from its first load to its second, and so all
/// held theirs when the last was loaded. Values do not come back once replaced (a doorbell
/// names its QP and WQE index, which a ringer would reuse only 65536 WQEs later).
#[inline]
pub(crate) fn at_one_moment(mut load: impl FnMut(usize) -> u64) -> Doorbell {
    loop {
        let db: Doorbell = std::array::from_fn(&mut load);
        if (0..HALVES - 1).all(|h| load(h) == db[h]) {
            return db;
        }
    }
}

/// A device's UAR pages and which QP holds which bfreg.
#[derive(Default)]
pub(crate) struct UarPages {
    pages: Vec<Arc<RingMem>>,
    /// Free bfreg numbers (page * BFREGS_PER_UAR + bfreg in the page).
    free: Vec<usize>,
    by_qpn: HashMap<u32, usize>,
    /// The GPUs new pages are mapped for (streams and kernels ring the doorbells).
    gpus: Option<Arc<Cuda>>,
}

impl UarPages {
    /// A bfreg for QP `qpn`: a free one, or the first of a new page.
    pub(crate) fn alloc(&mut self, qpn: u32) -> Bfreg {
        let n = self.free.pop().unwrap_or_else(|| {
            self.pages
                .push(Arc::new(RingMem::new(UAR_SIZE, self.gpus.as_ref())));
            let first = (self.pages.len() - 1) * BFREGS_PER_UAR;
            self.free.extend((first + 1..first + BFREGS_PER_UAR).rev());
            first
        });
        self.by_qpn.insert(qpn, n);
        Bfreg::single(
            self.pages[n / BFREGS_PER_UAR].clone(),
            BF_OFFSET + (n % BFREGS_PER_UAR) * BF_REG_SIZE,
        )
    }

    /// Maps the pages made from now on for the GPUs of `gpus`.
    pub(crate) fn map_for(&mut self, gpus: Option<&Arc<Cuda>>) {
        self.gpus = gpus.cloned();
    }

    /// QP `qpn` was destroyed: its bfreg serves a later QP.
    pub(crate) fn release(&mut self, qpn: u32) {
        if let Some(n) = self.by_qpn.remove(&qpn) {
            self.free.push(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::doorbell_value;
    use std::cell::Cell;

    /// libmlx5's doorbell for the one-block WQE at `idx` of QP `qpn` (its ctrl's first 8 bytes).
    fn rung(qpn: u32, idx: u16) -> u64 {
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&((u32::from(idx) << 8) | 0x08).to_be_bytes());
        head[4..].copy_from_slice(&((qpn << 8) | 2).to_be_bytes());
        doorbell_value(head)
    }

    /// [`at_one_moment`] over halves that hold `before`, while a poster writes `writes` (in
    /// order) just after the look's load number `after` (from 0).
    fn look_while_rung(before: Doorbell, writes: &[(usize, u64)], after: usize) -> Doorbell {
        let (mem, loads) = (before.map(Cell::new), Cell::new(0));
        at_one_moment(|h| {
            let v = mem[h].get();
            if loads.replace(loads.get() + 1) == after {
                writes.iter().for_each(|&(at, value)| mem[at].set(value));
            }
            v
        })
    }

    /// Two doorbells of one QP rung one after the other, whichever halves they land in (a QP on
    /// a dynamic UAR page is rung at its pair bfreg as well, whose halves libmlx5 alternates
    /// between with the other QPs of the page), at any point of a look: the look shows both or
    /// neither. Showing the later alone made the next look find the earlier one new, behind
    /// the later, and the strict check called it a doorbell going backwards (the mlx5 mp run
    /// failed so under the ioctl ABI: the pair's first half loaded before the earlier doorbell,
    /// its second half after the later).
    #[test]
    fn a_look_shows_a_moment_of_the_halves_whatever_is_rung_meanwhile() {
        let before = [rung(3, 7), 0, rung(4, 25966), rung(4, 26111)];
        for first in 0..HALVES {
            for second in (0..HALVES).filter(|&h| h != first) {
                let writes = [(first, rung(4, 26112)), (second, rung(4, 26113))];
                let mut after_both = before;
                for (at, value) in writes {
                    after_both[at] = value;
                }
                for after in 0..2 * HALVES {
                    let seen = look_while_rung(before, &writes, after);
                    assert!(
                        seen == before || seen == after_both,
                        "rung at halves {first} then {second} after load {after}: the look shows {seen:x?}, which the halves never held together"
                    );
                }
            }
        }
    }

    #[test]
    fn bfregs_lie_where_mlx5_puts_them_and_are_reused() {
        let mut u = UarPages::default();
        let regs: Vec<Bfreg> = (1..=5).map(|q| u.alloc(q)).collect();
        let offs: Vec<usize> = regs.iter().map(|b| b.off).collect();
        assert_eq!(offs, [0x800, 0xA00, 0xC00, 0xE00, 0x800]);
        for b in &regs {
            // Both halves inside the page.
            assert!(b.off + BF_SIZE + 8 <= UAR_SIZE);
        }
        assert!(Arc::ptr_eq(&regs[0].page, &regs[3].page));
        assert!(
            !Arc::ptr_eq(&regs[0].page, &regs[4].page),
            "a fifth QP opens a page"
        );
        u.release(2);
        let again = u.alloc(6);
        assert!(Arc::ptr_eq(&again.page, &regs[1].page) && again.off == 0xA00);
    }
}

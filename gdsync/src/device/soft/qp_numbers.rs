//! The soft device's QP numbers: which are in use, and which are free for a new QP.

use super::MAX_QPS;
use crate::{Error, Result};
use std::collections::{HashSet, VecDeque};

/// How many freed QP numbers wait before the oldest is used again.
pub(crate) const QPN_REST: usize = 1024;

/// A device's QP numbers. As an HCA does, numbers of destroyed QPs are used again, so the
/// numbers and the engine's tables stay bounded by the most QPs alive at once (plus
/// [`QPN_REST`]). A freed number rests behind at least `QPN_REST` others before it names a
/// new QP: packets of its old life still on a link are long gone by then (every QP's packet
/// sequence starts at 0, so the sequence alone would not tell an old packet from a new one).
pub(crate) struct QpNumbers {
    /// Numbers are `base + 1 ..= base + limit` (0 is never a QPN).
    base: u32,
    limit: u32,
    /// The largest number handed out so far, less `base`.
    next: u32,
    free: VecDeque<u32>,
    /// Numbers of QPs that exist (in-process peers check before they link).
    live: HashSet<u32>,
}

impl Default for QpNumbers {
    fn default() -> Self {
        Self::within(0, MAX_QPS)
    }
}

impl QpNumbers {
    /// Numbers `base + 1 ..= base + limit` only (a share of an HCA's numbers that several
    /// processes serve; `base + limit` at most [`MAX_QPS`]).
    pub(crate) fn within(base: u32, limit: u32) -> Self {
        debug_assert!(base.checked_add(limit).is_some_and(|top| top <= MAX_QPS));
        Self {
            base,
            limit,
            next: 0,
            free: VecDeque::new(),
            live: HashSet::new(),
        }
    }

    /// A number for a new QP.
    pub(crate) fn take(&mut self) -> Result<u32> {
        let fresh_left = self.next < self.limit;
        let n = if self.free.len() > QPN_REST || (!fresh_left && !self.free.is_empty()) {
            self.free.pop_front().expect("checked")
        } else if fresh_left {
            self.next += 1;
            self.base + self.next
        } else {
            return Err(Error::invalid(format!(
                "a soft device serves at most {} QPs at a time: destroy some first",
                self.limit
            )));
        };
        self.live.insert(n);
        Ok(n)
    }

    /// A destroyed QP's number, free for a later QP.
    pub(crate) fn give_back(&mut self, n: u32) {
        if self.live.remove(&n) {
            self.free.push_back(n);
        }
    }

    /// Whether QP `n` exists.
    pub(crate) fn is_live(&self, n: u32) -> bool {
        self.live.contains(&n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_numbers_rest_behind_others_before_reuse() {
        let mut q = QpNumbers::default();
        let first = q.take().unwrap();
        assert_eq!(first, 1);
        q.give_back(first);
        assert!(!q.is_live(first));
        // The next QPN_REST numbers are fresh ones; the freed one waits behind them.
        let mut fresh = Vec::new();
        for _ in 0..=QPN_REST {
            let n = q.take().unwrap();
            assert_ne!(n, first);
            fresh.push(n);
        }
        for n in fresh {
            q.give_back(n);
        }
        assert_eq!(
            q.take().unwrap(),
            first,
            "the oldest freed number comes back first"
        );
        assert!(q.is_live(first));
    }

    #[test]
    fn a_share_of_the_numbers_stays_in_its_range() {
        let mut q = QpNumbers::within(3 << 12, 4095);
        let all: Vec<u32> = (0..4095).map(|_| q.take().unwrap()).collect();
        assert_eq!((all[0], all[4094]), (0x3001, 0x3fff));
        assert!(q.take().is_err(), "the share is used up");
        q.give_back(0x3005);
        assert_eq!(q.take().unwrap(), 0x3005);
    }

    #[test]
    fn a_number_given_back_twice_is_free_once() {
        let mut q = QpNumbers::default();
        let n = q.take().unwrap();
        q.give_back(n);
        q.give_back(n);
        assert_eq!(q.free.len(), 1);
    }
}

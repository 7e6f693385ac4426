//! The credit protocol checked over every interleaving: a receiver posts receives in batches
//! and, after each batch, gives that many credits (a fetch-and-add on the sender's credit
//! word, which lands later); the sender posts send `k` once [`credit_allows`] says the credit
//! word allows it. For every split of up to 6 receives into batches and every order of the
//! two sides' steps (the adds landing in order, as RC delivers them), with the credit word
//! starting at 0 and just below the 64-bit wrap: no send is ever posted before its receive
//! (the receiver's slots never overrun), and once the receiver is done every send can go (no
//! credit is lost). The guard is the real one; the steps are a model of `irecv_batch` (post
//! the receives, then one add) and of the queue `pump` serves in order.

use super::credit_allows;
use std::collections::HashSet;

/// Where both sides are.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct State {
    /// Receiver: batches whose receives are posted / whose add was issued / that landed.
    posted: usize,
    issued: usize,
    landed: usize,
    /// Sender: sends posted.
    sent: u64,
}

struct Model {
    batches: Vec<u64>,
    /// The credit word's value before any add (0 in the library).
    base: u64,
}

impl Model {
    fn receives(&self, batches: usize) -> u64 {
        self.batches[..batches].iter().sum()
    }
    fn credit(&self, s: &State) -> u64 {
        self.base.wrapping_add(self.receives(s.landed))
    }
    /// The send `need`, in the sender's numbering (which starts past the base as the
    /// library's does from 0).
    fn need(&self, sent: u64) -> u64 {
        self.base.wrapping_add(sent + 1)
    }
    fn next(&self, s: State) -> Vec<State> {
        let mut out = Vec::new();
        let n = self.batches.len();
        if s.posted < n && s.issued == s.posted {
            out.push(State {
                posted: s.posted + 1,
                ..s
            });
        }
        if s.issued < s.posted {
            out.push(State {
                issued: s.issued + 1,
                ..s
            });
        }
        if s.landed < s.issued {
            out.push(State {
                landed: s.landed + 1,
                ..s
            });
        }
        if s.sent < self.receives(n) && credit_allows(self.credit(&s), self.need(s.sent)) {
            // The invariant: the receive for this send is posted.
            assert!(
                s.sent < self.receives(s.posted),
                "send {} posted before its receive: {s:?}, batches {:?}, base {}",
                s.sent + 1,
                self.batches,
                self.base
            );
            out.push(State {
                sent: s.sent + 1,
                ..s
            });
        }
        out
    }

    /// Explores every reachable state; returns how many.
    fn explore(&self) -> usize {
        let start = State {
            posted: 0,
            issued: 0,
            landed: 0,
            sent: 0,
        };
        let (mut seen, mut stack) = (HashSet::from([start]), vec![start]);
        let total = self.receives(self.batches.len());
        while let Some(s) = stack.pop() {
            let next = self.next(s);
            if next.is_empty() {
                // Nothing can move: every receive posted, credited and matched by a send.
                assert_eq!(
                    (s.landed, s.sent),
                    (self.batches.len(), total),
                    "stuck at {s:?}, batches {:?}, base {}",
                    self.batches,
                    self.base
                );
            }
            for t in next {
                if seen.insert(t) {
                    stack.push(t);
                }
            }
        }
        seen.len()
    }
}

/// Every way to split `n` receives into batches.
fn splits(n: u64) -> Vec<Vec<u64>> {
    if n == 0 {
        return vec![vec![]];
    }
    (1..=n)
        .flat_map(|first| {
            splits(n - first).into_iter().map(move |mut rest| {
                rest.insert(0, first);
                rest
            })
        })
        .collect()
}

#[test]
fn no_send_before_its_receive_and_no_credit_lost_in_any_order() {
    let mut states = 0;
    for n in 1..=6 {
        for batches in splits(n) {
            for base in [0, u64::MAX - 3] {
                states += Model {
                    batches: batches.clone(),
                    base,
                }
                .explore();
            }
        }
    }
    assert!(states > 1000, "{states} states");
}

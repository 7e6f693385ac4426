//! How many TCP links this process's listener accepts: at most so many from one source
//! address and so many in all. Each accepted link costs two threads and, flooded, about 18 MB
//! (rings, buffers, the answers it queues), and a job member may claim a fresh device uid in every
//! hello, so only bounds on what it cannot forge hold its cost down: the source address of
//! the connection (a hello's host id and pid are the dialer's word), and the total.
//!
//! A [`LinkSlot`] is one accepted link's place in the budget; it goes back when the slot is
//! dropped, which the link does when it is released (its engine end and transport threads
//! all gone: [`BridgeSignal::hold`](super::bridge::BridgeSignal::hold)).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

/// Links accepted from one source address at once, at most (default [`DEFAULT_PER_ADDR`]).
pub(crate) const PER_ADDR_ENV: &str = "GDSYNC_SOFT_MAX_LINKS_PER_ADDR";
/// Links accepted at once in all, at most (default [`DEFAULT_TOTAL`]).
pub(crate) const TOTAL_ENV: &str = "GDSYNC_SOFT_MAX_LINKS";
/// 8 flooded links cost about 150 MB: one host's processes, however they behave, keep this
/// process's growth under the 256 MB `docs/reliability.md` states.
pub(crate) const DEFAULT_PER_ADDR: usize = 8;
pub(crate) const DEFAULT_TOTAL: usize = 256;

/// The counts of links accepted and not yet released, and their bounds.
#[derive(Debug)]
pub(crate) struct LinkBudget {
    per_addr: usize,
    total: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    by_addr: HashMap<IpAddr, usize>,
    total: usize,
}

/// Why a link was refused: the bound it would pass, and the variable that sets it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OverBudget {
    Addr { addr: IpAddr, bound: usize },
    Total { bound: usize },
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OverBudget::Addr { addr, bound } => write!(
                f,
                "{addr} has {bound} links to this process already, the most one address may have ({PER_ADDR_ENV}={bound}; raise it where one host runs more peers than that)"
            ),
            OverBudget::Total { bound } => write!(
                f,
                "this process has {bound} TCP links already, the most it accepts ({TOTAL_ENV}={bound}; raise it where a job needs more)"
            ),
        }
    }
}

/// One accepted link's place in its budget, given back on drop.
#[derive(Debug)]
pub(crate) struct LinkSlot {
    budget: Arc<LinkBudget>,
    addr: IpAddr,
}

impl Drop for LinkSlot {
    fn drop(&mut self) {
        let mut h = self.budget.held.lock();
        h.total = h.total.saturating_sub(1);
        if let Some(n) = h.by_addr.get_mut(&self.addr) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                h.by_addr.remove(&self.addr);
            }
        }
    }
}

impl LinkBudget {
    pub(crate) fn new(per_addr: usize, total: usize) -> Arc<Self> {
        Arc::new(Self {
            per_addr,
            total,
            held: Mutex::new(Held::default()),
        })
    }

    /// A place for one more link from `addr`, or why there is none.
    pub(crate) fn claim(self: &Arc<Self>, addr: IpAddr) -> Result<LinkSlot, OverBudget> {
        // An IPv4 peer of an IPv6 listener is the same peer as over IPv4.
        let addr = addr.to_canonical();
        let mut h = self.held.lock();
        if h.total >= self.total {
            return Err(OverBudget::Total { bound: self.total });
        }
        let n = h.by_addr.entry(addr).or_default();
        if *n >= self.per_addr {
            return Err(OverBudget::Addr {
                addr,
                bound: self.per_addr,
            });
        }
        *n += 1;
        h.total += 1;
        Ok(LinkSlot {
            budget: self.clone(),
            addr,
        })
    }
}

/// This process's budget, with the bounds of the environment (read once).
pub(crate) fn process_budget() -> &'static Arc<LinkBudget> {
    static B: OnceLock<Arc<LinkBudget>> = OnceLock::new();
    B.get_or_init(|| {
        LinkBudget::new(
            bound_from_env(PER_ADDR_ENV, DEFAULT_PER_ADDR),
            bound_from_env(TOTAL_ENV, DEFAULT_TOTAL),
        )
    })
}

/// A positive count from `name`; the default (and a warning) for anything else.
fn bound_from_env(name: &str, default: usize) -> usize {
    let Ok(v) = std::env::var(name) else {
        return default;
    };
    match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => n,
        _ => {
            tracing::warn!("{name}={v:?}: expected a positive number of links; using {default}");
            default
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn each_address_has_its_bound_and_all_together_theirs() {
        let b = LinkBudget::new(2, 3);
        let a1 = b.claim(ip("10.0.0.1")).unwrap();
        let _a2 = b.claim(ip("10.0.0.1")).unwrap();
        let over = b.claim(ip("10.0.0.1")).unwrap_err();
        assert_eq!(
            over,
            OverBudget::Addr {
                addr: ip("10.0.0.1"),
                bound: 2
            }
        );
        assert!(over.to_string().contains(PER_ADDR_ENV), "{over}");
        // Another address still gets in, up to the total.
        let _b1 = b.claim(ip("10.0.0.2")).unwrap();
        let total = b.claim(ip("10.0.0.3")).unwrap_err();
        assert_eq!(total, OverBudget::Total { bound: 3 });
        assert!(total.to_string().contains(TOTAL_ENV), "{total}");
        // A released link gives its place back.
        drop(a1);
        let _a3 = b.claim(ip("10.0.0.1")).unwrap();
    }

    #[test]
    fn an_ipv4_peer_counts_the_same_over_an_ipv6_listener() {
        let b = LinkBudget::new(1, 10);
        let _v4 = b.claim(ip("10.0.0.1")).unwrap();
        assert!(b.claim(ip("::ffff:10.0.0.1")).is_err());
    }

    #[test]
    fn bounds_from_the_environment_are_positive_numbers() {
        // Variables no other test sets.
        std::env::set_var("GDSYNC_TEST_LINK_BOUND_A", "40");
        std::env::set_var("GDSYNC_TEST_LINK_BOUND_B", "0");
        assert_eq!(bound_from_env("GDSYNC_TEST_LINK_BOUND_A", 16), 40);
        assert_eq!(bound_from_env("GDSYNC_TEST_LINK_BOUND_B", 16), 16);
        assert_eq!(bound_from_env("GDSYNC_TEST_LINK_BOUND_UNSET", 16), 16);
    }
}

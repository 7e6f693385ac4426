//! The engine's state in words, for a stall report: per QP, its connection, where its send
//! and receive rings stand (consumed against posted), the doorbell halves that moved since the
//! engine last read them, and its CQs' producer indices; per link, what is queued on it.
//! What a ConnectX's firmware dump would show of the same moment, read without changing
//! anything.

use super::{Engine, QpContext};
use std::sync::atomic::Ordering;

impl Engine {
    /// One entry per active QP (`QP <qpn> -> <remote qpn>: ...; `) and then the links: what a
    /// stalled program's report adds so that "nothing arrives" can be told apart from
    /// "nothing was posted", "a doorbell went unseen" and "waiting for a link".
    pub(crate) fn state_report(&self) -> String {
        let mut out = String::new();
        for q in (self.active.iter()).filter_map(|&n| self.qps.get(n)) {
            out.push_str(&format!(
                "QP {:#x} -> {:#x}: {}; ",
                q.hw.qpn,
                q.rqpn,
                qp_state(q).join(", ")
            ));
        }
        let links: Vec<String> = (self.links.iter().enumerate())
            .map(|(i, l)| {
                let dead = if l.link.dead { " (dead)" } else { "" };
                format!(
                    "link {i} to {:016x}{dead}: {} queued",
                    l.link.peer,
                    l.queue.len()
                )
            })
            .collect();
        out.push_str(&links.join(", "));
        out
    }
}

/// The parts of one QP's entry, in the order a reader follows a message: connection, send
/// ring, doorbell, receive ring, completions.
fn qp_state(q: &QpContext) -> Vec<String> {
    let mut parts = vec![match q.link {
        Some(l) => format!("link {l}"),
        None => "link none".to_string(),
    }];
    if let Some(peer) = q.awaiting {
        parts.push(format!("awaiting link to {peer:016x}"));
    }
    if q.err {
        parts.push("in error".into());
    }
    if q.peer_gone {
        parts.push("peer gone".into());
    }
    let (ci, pi) = (q.sq.ci as u16, q.hw.sq_producer());
    parts.push(format!("send ring {ci}/{pi} (consumed/posted)"));
    parts.push(format!("{} in flight", q.sq.out.len()));
    if q.sq.pending {
        parts.push("pending".into());
    }
    if q.sq.retry_at.is_some() {
        parts.push("retry timer set".into());
    }
    let db = q.hw.doorbell();
    let unread: Vec<String> = (db.iter().zip(q.sq.last_db.iter()).enumerate())
        .filter(|(_, (now, last))| now != last)
        .map(|(h, (now, _))| format!("half {h} {now:#x}"))
        .collect();
    parts.push(match unread.is_empty() {
        true => "doorbell seen".into(),
        false => format!("doorbell not yet read: {}", unread.join(" ")),
    });
    parts.push(format!(
        "receive ring {}/{}",
        q.rq.ci as u16,
        q.hw.rq_producer()
    ));
    let (s, r) = (&q.hw.send_cq, &q.hw.recv_cq);
    parts.push(format!(
        "CQEs written: send CQ {:#x} {}, receive CQ {:#x} {}",
        s.cqn,
        s.pi.load(Ordering::Relaxed),
        r.cqn,
        r.pi.load(Ordering::Relaxed)
    ));
    parts
}

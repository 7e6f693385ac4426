//! The engine's state in words, for a stall report: per QP, its connection, where its send
//! and receive rings stand (consumed against posted), the doorbell halves that moved since the
//! engine last read them, and its CQs' producer indices; per link, what is queued on it.
//! What a ConnectX's firmware dump would show of the same moment, read without changing
//! anything.

use super::Engine;
use std::fmt::Write;

impl Engine {
    /// One line per active QP and one for the links: what a stalled program's report adds
    /// so that "nothing arrives" can be told apart from "nothing was posted", "a doorbell
    /// went unseen" and "waiting for a link".
    pub(crate) fn state_report(&self) -> String {
        let mut out = String::new();
        for &qpn in &self.active {
            let Some(q) = self.qps.get(qpn) else {
                continue;
            };
            let db = q.hw.doorbell();
            let unseen: Vec<String> = (db.iter().zip(q.sq.last_db.iter()))
                .enumerate()
                .filter(|(_, (now, last))| now != last)
                .map(|(h, (now, _))| format!("half {h} {now:#x}"))
                .collect();
            let _ = write!(
                out,
                "QP {qpn:#x} -> {:#x}: link {}, {}{}{}send ring {}/{} (consumed/posted), {} in flight{}{}, doorbell {}, receive ring {}/{}, CQEs written: send CQ {:#x} {}, receive CQ {:#x} {}; ",
                q.rqpn,
                q.link.map_or("none".to_string(), |l| l.to_string()),
                q.awaiting.map_or(String::new(), |p| format!("awaiting link to {p:016x}, ")),
                if q.err { "in error, " } else { "" },
                if q.peer_gone { "peer gone, " } else { "" },
                q.sq.ci as u16,
                q.hw.sq_producer(),
                q.sq.out.len(),
                if q.sq.pending { ", pending" } else { "" },
                if q.sq.retry_at.is_some() { ", retry timer set" } else { "" },
                if unseen.is_empty() { "seen".to_string() } else { format!("not yet read: {}", unseen.join(", ")) },
                q.rq.ci as u16,
                q.hw.rq_producer(),
                q.hw.send_cq.cqn,
                q.hw.send_cq.pi.load(std::sync::atomic::Ordering::Relaxed),
                q.hw.recv_cq.cqn,
                q.hw.recv_cq.pi.load(std::sync::atomic::Ordering::Relaxed),
            );
        }
        let queued: Vec<String> = (self.links.iter().enumerate())
            .map(|(i, l)| {
                format!(
                    "link {i} to {:016x}{}: {} queued",
                    l.link.peer,
                    if l.link.dead { " (dead)" } else { "" },
                    l.queue.len()
                )
            })
            .collect();
        let _ = write!(out, "{}", queued.join(", "));
        out
    }
}

//! Timers, run on a polling round's tick: links whose peer died or closed, retry delays that
//! ran out (RNR, peer not ready), and the transport timeout of QPs whose peer went silent.

use super::Engine;
use crate::format::Syndrome;
use crate::provider::AsyncEvent;
use std::time::{Duration, Instant};

impl Engine {
    /// Checks links and QP timers at `now`. Returns whether anything happened.
    pub(super) fn timers(&mut self, now: Instant) -> bool {
        let links = self.check_links(now);
        self.check_cqs();
        self.qp_timers(now) || links
    }

    /// The strict consumer-index check of every CQ an active QP completes to
    /// ([`check_cq`](super::completion::check_cq)).
    fn check_cqs(&self) {
        for &qpn in &self.active {
            if let Some(q) = self.qps.get(qpn) {
                super::completion::check_cq(&q.hw.send_cq);
                super::completion::check_cq(&q.hw.recv_cq);
            }
        }
    }

    /// Fails the QPs of every link found down since the last check, then releases the link
    /// ([`release_link`](Engine::release_link)).
    fn check_links(&mut self, now: Instant) -> bool {
        let mut work = false;
        let mut li = 0;
        while li < self.links.len() {
            if !self.links[li].link.dead && !self.links[li].link.check_alive(now) {
                self.link_down(li);
                // The last link moves into `li`: it is looked at next.
                self.release_link(li);
                work = true;
                continue;
            }
            li += 1;
        }
        work
    }

    /// Link `li` went down: its queue is dropped and its QPs fail with transport retries
    /// exceeded, except, where another process closed the link in order (it dropped its
    /// device or exited cleanly, as a verbs program's end does), the QPs with nothing
    /// outstanding: those keep their state and posted receives, as a ConnectX's QP learns
    /// nothing of a peer's exit ([`peer_gone`](super::QpContext::peer_gone)). Returns whether
    /// a QP failed. (A device of this process dropped still fails its peers' QPs.)
    fn link_down(&mut self, li: usize) -> bool {
        let (peer, why) = (self.links[li].link.peer, self.links[li].link.down_reason());
        if self.links[li].link.peer_process_closed() {
            self.detach_idle(li);
        }
        let hit: Vec<u32> = (self.active.iter().copied())
            .filter(|&qpn| (self.qps.get(qpn)).is_some_and(|q| q.link == Some(li) && !q.err))
            .collect();
        // A peer that dropped its device closed the link in order, and a link no working QP
        // uses any more (a peer process that ended after its run) harms nothing; anything
        // else (a process that died mid-run, a failed connection) is a fault.
        if self.links[li].link.peer_closed() || hit.is_empty() {
            tracing::debug!("soft device: link to peer device {peer:016x} closed ({why})");
        } else {
            tracing::warn!("soft device: link to peer device {peer:016x} is down ({why}): its {} QP(s) fail with transport retries exceeded", hit.len());
        }
        self.links[li].queue.clear();
        self.ctl.event(AsyncEvent::PeerLost { peer });
        for &qpn in &hit {
            self.fail_first(qpn, Syndrome::TransportRetryExc);
        }
        !hit.is_empty()
    }

    /// The QPs of link `li`, whose peer closed it in order, that have nothing outstanding
    /// (no request unanswered, no retry waiting) lose the link but not their state.
    fn detach_idle(&mut self, li: usize) {
        for i in 0..self.active.len() {
            let qpn = self.active[i];
            let Some(q) = self.qps.get_mut(qpn) else {
                continue;
            };
            if q.link == Some(li) && !q.err && q.sq.out.is_empty() && q.sq.retry_at.is_none() {
                q.link = None;
                q.peer_gone = true;
                q.rq.published = false;
                self.targets.close(qpn);
            }
        }
    }

    /// Ends retry delays that ran out and fails QPs whose peer has not answered within
    /// their timeout.
    fn qp_timers(&mut self, now: Instant) -> bool {
        let mut work = false;
        for i in 0..self.active.len() {
            let qpn = self.active[i];
            let Some(q) = self.qps.get_mut(qpn) else {
                continue;
            };
            if q.sq.retry_at.is_some_and(|t| now >= t) {
                q.sq.retry_at = None;
                q.sq.pending = true;
                work = true;
            }
            if q.sq.progressed {
                q.sq.progressed = false;
                q.sq.progress_at = now;
            }
            let waiting = !q.sq.out.is_empty() || q.sq.not_ready;
            // The stamp is this tick's reading or an earlier tick's, taken at or after the
            // progress it marks (a QP's creation stamps the coarse clock: one millisecond
            // of slack so the timeout never fires early).
            if !q.err
                && waiting
                && now.duration_since(q.sq.progress_at)
                    > q.hw.timers.timeout + Duration::from_millis(1)
            {
                tracing::warn!(
                    "soft device: QP {qpn:#x}: no answer from peer QP {:#x} within {:?}: transport retries exceeded",
                    q.rqpn,
                    q.hw.timers.timeout
                );
                self.fail_first(qpn, Syndrome::TransportRetryExc);
                work = true;
            }
        }
        work
    }
}

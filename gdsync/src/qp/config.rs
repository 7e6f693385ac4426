//! A QP's sizes and transport settings, its limits, and its states.

use crate::format::{MAX_WQE_DS, MAX_WQE_WQEBBS, SEG_SIZE};
use crate::{Error, Result};
use std::time::Duration;

use crate::provider::QpRoute;
pub use crate::provider::{MAX_MESSAGE, MAX_SGE};

/// The environment variable for [`QpConfig::traffic_class`] (0 to 255).
pub const IB_TC_VAR: &str = "GDSYNC_IB_TC";
/// The environment variable for [`QpConfig::service_level`] (0 to 15).
pub const IB_SL_VAR: &str = "GDSYNC_IB_SL";
/// The environment variable for [`QpConfig::hop_limit`] (1 to 255).
pub const IB_HOP_LIMIT_VAR: &str = "GDSYNC_IB_HOP_LIMIT";

/// QP sizes and transport settings.
#[derive(Clone, Debug)]
pub struct QpConfig {
    /// Send ring size in 64-byte WQEBBs (rounded up to a power of two; libmlx5 may make an
    /// mlx5 QP's larger: [`Qp::send_ring_size`](super::Qp::send_ring_size) says).
    pub send_wqebbs: u32,
    /// Receive ring size in WQEs (rounded up to a power of two).
    pub recv_wqes: u32,
    /// Most SGEs per receive (sets the receive WQE stride).
    pub max_recv_sge: u32,
    /// Most bytes of inline payload per send.
    pub max_inline: u32,
    /// How often a send is retried while the peer has no receive posted; then the work
    /// completes with `RNR_RETRY_EXC`. Unlike verbs, 7 is not "infinite": `u8::MAX` is (an
    /// mlx5 device retries at most 6 times short of that).
    pub rnr_retry: u8,
    /// Delay between receiver-not-ready retries.
    pub rnr_timer: Duration,
    /// How long outstanding work may go without any answer from the peer before it completes
    /// with `TRANSPORT_RETRY_EXC` (a dead peer process or a closed device is detected sooner).
    /// On an RDMA device this is split over the `retry_count + 1` tries, each of which waits
    /// the shortest IB transport timeout (4.096 µs × 2^n) that covers its share: the work then
    /// fails after at least `timeout` and less than twice it.
    pub timeout: Duration,
    /// How often an RDMA device retransmits after a transport timeout before the work fails
    /// (verbs' `retry_cnt`, 0 to 7; default 7). The soft device's links lose nothing, so it
    /// only waits out [`timeout`](Self::timeout).
    pub retry_count: u8,
    /// RoCE traffic class of the QP's packets (the global route header's: DSCP << 2 | ECN),
    /// which selects the fabric's priority: lossless RoCE fabrics commonly use 106 (DSCP 26),
    /// as `NCCL_IB_TC` sets for NCCL. `None`: `GDSYNC_IB_TC`, else 0.
    pub traffic_class: Option<u8>,
    /// InfiniBand service level (0 to 15; on RoCE the priority where the fabric maps it).
    /// `None`: `GDSYNC_IB_SL`, else 0.
    pub service_level: Option<u8>,
    /// Hop limit of the global route header (1 to 255). `None`: `GDSYNC_IB_HOP_LIMIT`,
    /// else 64.
    pub hop_limit: Option<u8>,
    /// Who rings the doorbell for op lists from [`Qp::commit`](super::Qp::commit); `None`: chosen automatically
    /// (`GDSYNC_NIC_HANDLER`, else the GPU).
    pub nic_handler: Option<crate::NicHandler>,
    /// Whether CPU posts interleave with sends committed for executors and kernels, which
    /// decides what each commit stores after its doorbell ([`Ringers`]).
    pub ringers: Ringers,
}

/// Who rings a QP's send doorbell, which decides whether a commit's doorbell is followed by
/// a store of how far it rang ("rung to").
///
/// A CPU post must never ring past sends committed for an executor or a kernel that has
/// not rung them yet: its doorbell would expose them early, and the older doorbell, still
/// to come, would then move the device's producer index backwards (a ConnectX never
/// accepts that). It knows they are rung from "rung to", which each ringer stores after
/// its doorbell, or from a completion of a send at or beyond them (the device executes only
/// what a doorbell exposed). On a GPU stream that store is one more memory operation per
/// commit (about 0.6 µs on an H200) and in a kernel an ordering at system scope: a QP that
/// mixes no CPU posts into its commits needs neither.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ringers {
    /// CPU posts ([`Qp::post_send`](super::Qp::post_send), batches rung on the CPU)
    /// interleave with commits: every commit stores "rung to" after its doorbell.
    #[default]
    Mixed,
    /// Sends are committed for executors and kernels; their commits store nothing after the
    /// doorbell. A CPU post is refused while committed sends are not known to be rung, that
    /// is until a completion at or beyond the last commit has been waited for or polled.
    Executors,
}

impl Default for QpConfig {
    fn default() -> Self {
        Self {
            send_wqebbs: 256,
            recv_wqes: 256,
            max_recv_sge: 4,
            max_inline: 220,
            rnr_retry: 7,
            rnr_timer: Duration::from_millis(2),
            timeout: Duration::from_secs(5),
            retry_count: 7,
            traffic_class: None,
            service_level: None,
            hop_limit: None,
            nic_handler: None,
            ringers: Ringers::Mixed,
        }
    }
}

/// State of a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum QpState {
    /// Created; receives may be posted.
    Init = 0,
    /// Connected: ready to send.
    Rts = 1,
    /// In error: remaining and new work completes with `WR_FLUSH`.
    Error = 2,
}

impl QpConfig {
    /// Whether the sizes are ones a QP can have.
    pub(crate) fn check(&self) -> Result<()> {
        if self.send_wqebbs == 0
            || self.send_wqebbs > 1 << 15
            || self.recv_wqes == 0
            || self.recv_wqes > 1 << 15
        {
            return Err(Error::invalid(
                "send_wqebbs and recv_wqes must be in 1..=32768",
            ));
        }
        if self.max_recv_sge == 0 || self.max_recv_sge as usize > MAX_SGE {
            return Err(Error::invalid(format!(
                "max_recv_sge must be in 1..={MAX_SGE}"
            )));
        }
        if self.retry_count > 7 {
            return Err(Error::invalid(format!(
                "retry_count {} exceeds 7 (verbs' retry_cnt has 3 bits)",
                self.retry_count
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::invalid(
                "timeout must be more than zero (it bounds how long a silent peer is waited for)",
            ));
        }
        self.route()?;
        // ctrl + raddr + the inline header must fit in the 63 DS a WQE can have.
        let max_inline = (MAX_WQE_DS * SEG_SIZE - 2 * SEG_SIZE - 4) as u32;
        if self.max_inline > max_inline {
            return Err(Error::invalid(format!(
                "max_inline {} exceeds {max_inline}",
                self.max_inline
            )));
        }
        Ok(())
    }

    /// Traffic class, service level and hop limit of the QP's path: the fields set here,
    /// else the environment's (`GDSYNC_IB_TC`, `GDSYNC_IB_SL`, `GDSYNC_IB_HOP_LIMIT`), else
    /// 0, 0 and 64; each checked against its range.
    pub(crate) fn route(&self) -> Result<QpRoute> {
        let pick =
            |set: Option<u8>, (field, var), range: std::ops::RangeInclusive<u32>, default| {
                let v = match set {
                    Some(v) if !range.contains(&u32::from(v)) => {
                        return Err(Error::invalid(format!(
                            "QpConfig::{field} {v} is out of {}..={}",
                            range.start(),
                            range.end()
                        )))
                    }
                    Some(v) => u32::from(v),
                    None => crate::env::number(var, range)?.unwrap_or(default),
                };
                Ok(v as u8)
            };
        Ok(QpRoute {
            traffic_class: pick(self.traffic_class, ("traffic_class", IB_TC_VAR), 0..=255, 0)?,
            service_level: pick(self.service_level, ("service_level", IB_SL_VAR), 0..=15, 0)?,
            hop_limit: pick(self.hop_limit, ("hop_limit", IB_HOP_LIMIT_VAR), 1..=255, 64)?,
        })
    }

    /// The send ring's size in WQEBBs: a power of two, at least the largest WQE.
    pub(crate) fn sq_cnt(&self) -> u32 {
        self.send_wqebbs
            .next_power_of_two()
            .max(MAX_WQE_WQEBBS as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_takes_the_fields_set_and_checks_their_ranges() {
        let cfg = QpConfig {
            traffic_class: Some(106),
            service_level: Some(3),
            hop_limit: Some(8),
            ..QpConfig::default()
        };
        let r = cfg.route().unwrap();
        assert_eq!((r.traffic_class, r.service_level, r.hop_limit), (106, 3, 8));
        for (cfg, what) in [
            (
                QpConfig {
                    service_level: Some(16),
                    ..QpConfig::default()
                },
                "QpConfig::service_level 16 is out of 0..=15",
            ),
            (
                QpConfig {
                    hop_limit: Some(0),
                    ..QpConfig::default()
                },
                "QpConfig::hop_limit 0 is out of 1..=255",
            ),
        ] {
            let e = cfg.route().unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
            assert!(cfg.check().is_err());
        }
    }
}

//! The device handle: the provider that serves it (opened by device selection,
//! [`Device::open`] and [`Device::soft`]) and the queue layer's objects it creates:
//! protection domains, completion queues, and through a domain, QPs.

use crate::context::DeviceContext;
use crate::cq::Cq;
use crate::cuda::Cuda;
use crate::mr::ProtectionDomain;
use crate::provider::Provider;
use crate::provider::{DeviceAttr, DeviceInfo, Endpoint, LinkKind, PortAttr};
use crate::Result;
use std::sync::Arc;

/// A NIC: the provider that serves its queues. Cloning gives another handle.
#[derive(Clone)]
pub struct Device {
    pub(crate) ctx: Arc<DeviceContext>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("uid", &format_args!("{:016x}", self.ctx.provider.uid()))
            .finish()
    }
}

impl Device {
    /// A device served by `provider`.
    /// A device served by `provider`, its queues' memory mapped for the GPUs of `cuda`.
    pub(crate) fn from_provider(provider: Arc<dyn Provider>, cuda: Option<Arc<Cuda>>) -> Self {
        Device {
            ctx: Arc::new(DeviceContext::new(provider, cuda)),
        }
    }

    /// The CUDA handle whose GPUs this device's queues are mapped for, if any.
    pub fn cuda(&self) -> Option<&Arc<Cuda>> {
        self.ctx.cuda.as_ref()
    }

    /// The link a [`Qp::connect`](crate::Qp::connect) to `remote` would use, or why there is
    /// none (conflicting link policies, another host under `GDSYNC_SOFT_LINK=shm`, an invalid
    /// policy).
    pub fn link_kind(&self, remote: &Endpoint) -> Result<LinkKind> {
        self.ctx.provider.link_kind(remote)
    }

    /// Name and id.
    pub fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.ctx.provider.name(),
            uid: self.ctx.provider.uid(),
        }
    }

    /// The device's limits (`ibv_query_device`).
    pub fn query(&self) -> DeviceAttr {
        self.ctx.provider.query_device()
    }

    /// Port `port`'s attributes (`ibv_query_port`; ports count from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.ctx.provider.query_port(port)
    }

    /// A new protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain::alloc(&self.ctx)
    }

    /// A completion queue of at least `entries` CQEs (rounded up to a power of two).
    pub fn create_cq(&self, entries: u32) -> Result<Cq> {
        Cq::create(&self.ctx, entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::MAX_MESSAGE;
    use crate::{PortState, QpConfig};

    /// Memory made without a CUDA handle stays plain host memory, whatever GPUs the process
    /// has: nothing asks a process-wide CUDA behind the caller's back.
    #[test]
    fn memory_made_without_a_cuda_handle_is_not_mapped_for_gpus() {
        let dev = Device::soft_with_cuda(None).unwrap();
        assert!(dev.cuda().is_none());
        let cq = dev.create_cq(16).unwrap();
        let qp = dev
            .alloc_pd()
            .create_qp(&cq, &cq, &QpConfig::default())
            .unwrap();
        assert!(!qp.shared.buf.gpu_mapped(), "QP rings");
        assert!(!qp.shared.ctrl.gpu_mapped(), "QP control page");
        assert!(!crate::PinnedBuffer::with_cuda(64, None).gpu_mapped());
        assert!(!crate::mem::RingMem::host(64).gpu_mapped());
    }

    #[test]
    fn the_limits_are_the_ones_queue_creation_enforces() {
        let dev = Device::soft().unwrap();
        let a = dev.query();
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(64).unwrap();
        let qp = |cfg: QpConfig| pd.create_qp(&cq, &cq, &cfg);
        let at_limit = QpConfig {
            send_wqebbs: a.max_qp_wr,
            recv_wqes: a.max_qp_wr,
            max_recv_sge: a.max_sge,
            max_inline: a.max_inline_data,
            ..QpConfig::default()
        };
        assert!(qp(at_limit.clone()).is_ok());
        for over in [
            QpConfig {
                send_wqebbs: a.max_qp_wr + 1,
                ..at_limit.clone()
            },
            QpConfig {
                recv_wqes: a.max_qp_wr + 1,
                ..at_limit.clone()
            },
            QpConfig {
                max_recv_sge: a.max_sge + 1,
                ..at_limit.clone()
            },
            QpConfig {
                max_inline: a.max_inline_data + 1,
                ..at_limit.clone()
            },
        ] {
            assert!(qp(over.clone()).is_err(), "{over:?}");
        }
        assert!(dev.create_cq(a.max_cqe + 1).is_err());
        assert_eq!(a.max_qp, crate::device::soft::MAX_QPS);
    }

    #[test]
    fn qps_ring_bfregs_of_a_uar_page_and_cpu_posts_alternate_halves() {
        let dev = Device::soft().unwrap();
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(64).unwrap();
        let mut a = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
        let mut b = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
        let (da, db) = (&a.shared.doorbell, &b.shared.doorbell);
        assert!(Arc::ptr_eq(&da.mem, &db.mem), "one UAR page");
        assert_eq!(da.mem.addr(0) % 4096, 0);
        assert_eq!((da.off, db.off), (0x800, 0xA00));
        assert_eq!(a.shared.bf_size, 0x100);
        a.connect(&b.endpoint()).unwrap();
        b.connect(&a.endpoint()).unwrap();
        // Each post rings the other half; the device serves both.
        for (i, half) in [(0u64, 0x100), (1, 0), (2, 0x100)] {
            a.post_send(&crate::SendWr::nop().wr_id(i)).unwrap();
            assert_eq!(a.bf_offset, half);
            let c = cq.wait_one(std::time::Duration::from_secs(20)).unwrap();
            assert!(c.is_ok() && c.wr_id == i, "{c:?}");
        }
    }

    #[test]
    fn one_active_port() {
        let dev = Device::soft().unwrap();
        let p = dev.query_port(1).unwrap();
        assert_eq!(p.state, PortState::Active);
        assert!(p.active_mtu > 0 && p.active_mtu == p.max_mtu);
        assert_eq!(p.max_msg_sz, MAX_MESSAGE);
        assert!(dev.query_port(0).is_err() && dev.query_port(2).is_err());
    }
}

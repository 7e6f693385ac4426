//! mlx5 CQs and QPs whose rings and doorbell records lie in memory the caller placed (a
//! parent domain's allocator, `Pd::placing`), against the real libibverbs and libmlx5 under
//! the emulated kernel driver: libmlx5 takes the memory given and lays the rings out in it,
//! says so through `mlx5dv_init_obj`, and a placement too small or on a plain PD is an error.
//! Each test runs its body in a child under the emulator; ignored where rdma-core is not
//! installed.

use gdsync::mlx5::{Context, Placement, QpCaps};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use uverbs_emu::in_child_under_emulator;

/// Page-aligned zeroed memory, freed on drop.
struct Pages {
    ptr: *mut u8,
    layout: Layout,
}

impl Pages {
    fn new(len: usize) -> Pages {
        let layout = Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a nonzero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Pages { ptr, layout }
    }
    /// `ring_len` bytes of ring at the start, the doorbell record in the last 64 bytes.
    fn placement(&self, ring_len: usize) -> Placement {
        Placement {
            ring: self.ptr as usize,
            ring_len,
            dbrec: self.ptr as usize + self.layout.size() - 64,
        }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: allocated in new with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

#[test]
#[cfg_attr(
    not(rdma_core),
    ignore = "needs rdma-core (apt-get install libibverbs1 ibverbs-providers)"
)]
fn mlx5_rings_placed_by_the_caller() {
    if in_child_under_emulator("mlx5_rings_placed_by_the_caller", "mlx5_0") {
        return;
    }
    let ctx = Context::open("mlx5_0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let placing = pd.placing().unwrap();

    let cq_mem = Pages::new(64 << 10);
    let at = cq_mem.placement(32 << 10);
    let cq = placing.create_cq_in(64, at).unwrap();
    let r = cq.ring();
    assert_eq!((r.buf, r.dbrec), (at.ring, at.dbrec), "{r:?}");
    assert!(r.cqe_cnt >= 64);
    // Every entry marked unwritten in the placed memory (an owner-bit wait cannot pass).
    // SAFETY: reading the placed ring, which the test owns.
    let last = unsafe { cq_mem.ptr.add(r.cqe_cnt as usize * 64 - 1).read_volatile() };
    assert_eq!(last, 0xff);

    let qp_mem = Pages::new(256 << 10);
    let at = qp_mem.placement(128 << 10);
    let qp = placing
        .create_qp_in(&cq, &cq, &QpCaps::default(), at)
        .unwrap();
    let q = qp.rings();
    assert_eq!(q.dbrec, at.dbrec, "{q:?}");
    assert!(q.rq_buf == at.ring && q.sq_buf > at.ring, "{q:?}");
    assert!(q.sq_buf + (q.sq_wqe_cnt * q.sq_stride) as usize <= at.ring + at.ring_len);

    // Too small a ring, and a PD that is not a placing parent domain: errors that say so.
    let small = Pages::new(16 << 10);
    let e = placing
        .create_cq_in(1024, small.placement(4096))
        .err()
        .unwrap();
    assert!(e.to_string().contains("bytes of ring"), "{e}");
    let e = pd
        .create_cq_in(64, cq_mem.placement(32 << 10))
        .err()
        .unwrap();
    assert!(e.to_string().contains("not a placing parent domain"), "{e}");
    drop(qp);
    drop(cq);
}

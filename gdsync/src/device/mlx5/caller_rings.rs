//! Rings in memory the caller gives (caller rings): a parent domain (`ibv_alloc_parent_domain`) whose
//! allocator hands libmlx5 the memory given for the next CQ's entries, QP's buffer and their
//! doorbell records, instead of memory libmlx5 allocates itself. This is how a CQ or QP can
//! live in memory that was registered for a GPU beforehand (streams and kernels poll CQEs and
//! write doorbell records there). After each creation the layout libmlx5 reports
//! (`mlx5dv_init_obj`) is checked against what was given: a libmlx5 that ignores the
//! allocator, or asks for more than was given, is an error, never a silent fallback.

use super::context::Context;
use super::cq::{Cq, CQE_SIZE};
use super::error::RdmaError;
use super::pd::Pd;
use super::qp::{Qp, QpCaps};
use super::{sys, RdmaResult};
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// libmlx5's resource types for the allocator (`MLX5DV_RES_TYPE_*`: the driver id 1, mlx5,
/// in the upper half).
const RES_QP: u64 = 1 << 32 | 1;
const RES_DBR: u64 = 1 << 32 | 3;
const RES_CQ: u64 = 1 << 32 | 5;
/// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT` (without
/// the second, libmlx5 calls the allocator with no context), `IBV_CQ_INIT_ATTR_MASK_PD`.
const PD_ATTR_ALLOCATORS: u32 = 1 | 1 << 1;
const CQ_ATTR_MASK_PD: u32 = 1 << 1;
/// `IBV_ALLOCATOR_USE_DEFAULT`: the allocator declines, libmlx5 allocates.
const USE_DEFAULT: *mut c_void = usize::MAX as *mut c_void;

/// Where the next object's memory is: its ring (a CQ's entries, or a QP's receive then send
/// queue) and its doorbell record (8 bytes, 8-aligned), memory the caller gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerRings {
    /// Address of the ring (page-aligned).
    pub ring: usize,
    /// Its bytes.
    pub ring_len: usize,
    /// Address of the doorbell record.
    pub dbrec: usize,
}

/// What the allocator hands out for the creation in progress, and what it handed.
#[derive(Default)]
struct Slot {
    next: Option<CallerRings>,
    ring_given: bool,
    dbrec_given: bool,
    /// Set when libmlx5 asked for more ring than the caller's memory holds.
    too_small: Option<usize>,
}

/// A parent domain's parts that must outlive it.
pub(crate) struct ParentParts {
    _base: Arc<Pd>,
    slot: Box<Mutex<Slot>>,
    /// One creation at a time: the slot belongs to it.
    creating: Mutex<()>,
}

/// The allocator libmlx5 calls inside a create: the caller's memory for the ring and the
/// doorbell record of the object being created; the default for anything else.
unsafe extern "C" fn alloc(
    _pd: *mut sys::ibv_pd,
    ctx: *mut c_void,
    size: usize,
    alignment: usize,
    resource_type: u64,
) -> *mut c_void {
    // SAFETY: `ctx` is the slot this domain was created with, alive as long as the domain.
    let slot = unsafe { &*(ctx as *const Mutex<Slot>) };
    let Ok(mut s) = slot.lock() else {
        return USE_DEFAULT;
    };
    let Some(p) = s.next else {
        return USE_DEFAULT;
    };
    let aligned = |addr: usize| alignment <= 1 || addr % alignment == 0;
    match resource_type {
        RES_QP | RES_CQ if !s.ring_given => {
            if size > p.ring_len || !aligned(p.ring) {
                s.too_small = Some(size);
                return std::ptr::null_mut();
            }
            s.ring_given = true;
            p.ring as *mut c_void
        }
        RES_DBR if !s.dbrec_given && size <= 8 && aligned(p.dbrec) => {
            s.dbrec_given = true;
            p.dbrec as *mut c_void
        }
        _ => USE_DEFAULT,
    }
}

/// The allocator's release: the memory is the caller's, nothing to do.
unsafe extern "C" fn free(
    _pd: *mut sys::ibv_pd,
    _ctx: *mut c_void,
    _ptr: *mut c_void,
    _resource_type: u64,
) {
}

impl Pd {
    /// A parent domain of this PD whose CQs and QPs take their rings and doorbell records
    /// from memory the caller gives ([`Pd::create_cq_in`], [`Pd::create_qp_in`]).
    pub fn with_caller_rings(self: &Arc<Self>) -> RdmaResult<Arc<Pd>> {
        let ctx = &self.ctx;
        let slot: Box<Mutex<Slot>> = Box::default();
        let mut attr = sys::ibv_parent_domain_init_attr {
            pd: self.raw.as_ptr(),
            td: std::ptr::null_mut(),
            comp_mask: PD_ATTR_ALLOCATORS,
            alloc: Some(alloc),
            free: Some(free),
            pd_context: &*slot as *const Mutex<Slot> as *mut c_void,
        };
        let op = verbs_op!(ctx, alloc_parent_domain, "ibv_alloc_parent_domain")?;
        // SAFETY: FFI on the open context; the slot outlives the domain (held beside it).
        let raw = unsafe { op(ctx.raw.as_ptr(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("ibv_alloc_parent_domain"))?;
        Ok(Arc::new(Pd {
            ctx: ctx.clone(),
            raw,
            parent: Some(Box::new(ParentParts {
                _base: self.clone(),
                slot,
                creating: Mutex::new(()),
            })),
        }))
    }

    /// The former name of [`Pd::with_caller_rings`].
    #[doc(hidden)]
    pub fn placing(self: &Arc<Self>) -> RdmaResult<Arc<Pd>> {
        self.with_caller_rings()
    }

    /// Runs `create` with `at` as the memory the allocator hands out, then checks that
    /// libmlx5 took both the ring and the doorbell record from it.
    fn in_caller_rings<T>(
        &self,
        at: CallerRings,
        what: &str,
        create: impl FnOnce() -> RdmaResult<T>,
    ) -> RdmaResult<T> {
        let parts = self
            .parent
            .as_ref()
            .and_then(|p| p.downcast_ref::<ParentParts>())
            .ok_or_else(|| {
                RdmaError::InvalidArgument(format!(
                    "{what}: not a placing parent domain (Pd::with_caller_rings)"
                ))
            })?;
        let _one = parts.creating.lock().unwrap_or_else(|e| e.into_inner());
        let set = |next| {
            let mut s = parts.slot.lock().unwrap_or_else(|e| e.into_inner());
            *s = Slot {
                next,
                ..Slot::default()
            };
        };
        set(Some(at));
        let made = create();
        let s = std::mem::take(&mut *parts.slot.lock().unwrap_or_else(|e| e.into_inner()));
        set(None);
        if let Some(size) = s.too_small {
            return Err(RdmaError::InvalidArgument(format!(
                "{what}: libmlx5 asked for {size} bytes of ring, {} were given",
                at.ring_len
            )));
        }
        let made = made?;
        if !(s.ring_given && s.dbrec_given) {
            return Err(RdmaError::InvalidArgument(format!(
                "{what}: libmlx5 did not take its {} from the memory given (an rdma-core without parent-domain allocators?)",
                if s.ring_given { "doorbell record" } else { "ring" }
            )));
        }
        Ok(made)
    }

    /// A CQ of at least `entries` completions whose entries and doorbell record lie at `at`
    /// (libmlx5 sizes the ring: the next power of two above `entries`, 64 bytes each).
    pub fn create_cq_in(&self, entries: u32, at: CallerRings) -> RdmaResult<Arc<Cq>> {
        let ctx = &self.ctx;
        let cq = self.in_caller_rings(at, "create_cq_ex", || {
            let mut attr = sys::ibv_cq_init_attr_ex {
                cqe: entries,
                comp_mask: CQ_ATTR_MASK_PD,
                parent_domain: self.raw.as_ptr(),
                ..Default::default()
            };
            let op = verbs_op!(ctx, create_cq_ex, "ibv_create_cq_ex")?;
            // SAFETY: FFI on the open context; the attributes outlive the call.
            let raw = unsafe { op(ctx.raw.as_ptr(), &mut attr) };
            // An extended CQ begins with the plain one (`ibv_cq_ex_to_cq` is a cast).
            let raw = NonNull::new(raw.cast::<sys::ibv_cq>())
                .ok_or_else(|| RdmaError::last("ibv_create_cq_ex"))?;
            Cq::adopt(ctx, raw)
        })?;
        let r = cq.ring();
        let end = at.ring + at.ring_len;
        if r.buf != at.ring || r.buf + (r.cqe_cnt * CQE_SIZE) as usize > end || r.dbrec != at.dbrec
        {
            return Err(RdmaError::InvalidArgument(format!(
                "libmlx5 laid the CQ out elsewhere ({r:?}) than given ({at:?})"
            )));
        }
        Ok(cq)
    }

    /// An RC QP (as [`Pd::create_qp`]) whose receive and send queues and doorbell record lie
    /// at `at`.
    pub fn create_qp_in(
        self: &Arc<Self>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        caps: &QpCaps,
        at: CallerRings,
    ) -> RdmaResult<Qp> {
        let qp = self.in_caller_rings(at, "mlx5dv_create_qp", || {
            self.create_qp(send_cq, recv_cq, caps)
        })?;
        let r = qp.rings();
        let inside =
            |addr: usize, len: usize| addr >= at.ring && addr + len <= at.ring + at.ring_len;
        let sq_len = (r.sq_wqe_cnt * r.sq_stride) as usize;
        let rq_len = (r.rq_wqe_cnt * r.rq_stride) as usize;
        if !inside(r.sq_buf, sq_len)
            || (rq_len > 0 && !inside(r.rq_buf, rq_len))
            || r.dbrec != at.dbrec
        {
            return Err(RdmaError::InvalidArgument(format!(
                "libmlx5 laid the QP out elsewhere ({r:?}) than given ({at:?})"
            )));
        }
        Ok(qp)
    }
}

/// The start of libibverbs' extended context table (`verbs_get_ctx`), if the table reaches
/// the field at `field_off` (`verbs_get_ctx_op`: the table grows towards lower addresses, and
/// its `sz` says how much of it precedes the context).
fn ctx_table(ctx: &Context, field_off: usize, name: &str) -> RdmaResult<*const sys::verbs_context> {
    let missing =
        || RdmaError::InvalidArgument(format!("{name}: this rdma-core's context does not have it"));
    let raw = ctx.raw.as_ptr();
    // SAFETY: reading a field of the open context.
    let extended = unsafe { (*raw).abi_compat } as usize == usize::MAX;
    if !extended {
        return Err(missing());
    }
    let base = raw
        .cast::<u8>()
        .wrapping_sub(std::mem::offset_of!(sys::verbs_context, context))
        .cast::<sys::verbs_context>();
    // SAFETY: an extended context is the last field of a `verbs_context`; `sz`, just before
    // it, is part of every version of the table.
    let sz = unsafe { std::ptr::addr_of!((*base).sz).read() };
    if sz < std::mem::size_of::<sys::verbs_context>() - field_off {
        return Err(missing());
    }
    Ok(base)
}

/// An operation of the extended context table, or why there is none.
macro_rules! verbs_op {
    ($ctx:expr, $field:ident, $name:expr) => {{
        let off = std::mem::offset_of!(sys::verbs_context, $field);
        ctx_table($ctx, off, $name).and_then(|base| {
            // SAFETY: the table reaches the field (checked by ctx_table).
            unsafe { std::ptr::addr_of!((*base).$field).read() }.ok_or_else(|| {
                RdmaError::InvalidArgument(format!("{}: not provided by this rdma-core", $name))
            })
        })
    }};
}
use verbs_op;

//! What a GPU executes names memory at the GPUs' address of it, without a GPU: a fake mapper
//! puts every mapping at a constant distance from its host address (as an I/O-memory
//! registration may), and the stream memory operations, the commit and wait op lists as a
//! stream or a kernel's descriptor ring sees them, and the kernel QP descriptor must carry
//! the moved address, while the CPU executors keep storing at the host address. Also: which
//! stream waits flush inbound RDMA writes.

use super::stream::translate;
use super::GpuCaps;
use crate::exec::{Executor, HostExecutor};
use crate::kernel::{SendDesc, WaitDesc};
use crate::mem::{GpuMapper, RingMem};
use crate::ops::{Op, Ops};
use crate::qp::{QP_KERNEL_SQ_PI, QP_PROXY, QP_RQ_RETIRED, QP_SQ_RETIRED, QP_SQ_RUNG};
use crate::{Access, Device, NicHandler, QpConfig, SendWr};
use cudarc::driver::sys;
use std::sync::Arc;

/// How far the fake mapper puts the GPUs' view of host memory.
const DELTA: u64 = 0x7000_0000_0000;

fn gpu(host: u64) -> u64 {
    host + DELTA
}

/// A mapper whose device address is the host address plus [`DELTA`].
struct OffsetMapper;

impl GpuMapper for OffsetMapper {
    fn has_gpus(&self) -> bool {
        true
    }
    unsafe fn register(&self, ptr: *mut u8, _: usize) -> crate::Result<u64> {
        Ok(gpu(ptr as u64))
    }
    fn unregister(&self, _: *mut u8) {}
    unsafe fn register_foreign(&self, addr: u64, _: usize, _: bool) -> crate::Result<u64> {
        Ok(gpu(addr))
    }
    fn unregister_foreign(&self, _: u64) {}
}

/// A GPU with 64-bit memops and NOR waits that orders inbound writes (an H200).
fn h200() -> GpuCaps {
    GpuCaps {
        mem_ops_64: true,
        wait_nor: true,
        gpudirect_rdma_writes_ordering: 100,
        ..Default::default()
    }
}

/// (operation, address, flags) of each stream memory operation.
fn params(ops: &Ops, caps: &GpuCaps) -> Vec<(u32, u64, u32)> {
    use sys::CUstreamBatchMemOpType as T;
    let out = translate(ops, caps).unwrap();
    out.iter()
        .map(|p| {
            // SAFETY: every variant starts with its operation; the one it names is read.
            unsafe {
                match p.operation {
                    T::CU_STREAM_MEM_OP_WAIT_VALUE_32 | T::CU_STREAM_MEM_OP_WAIT_VALUE_64 => {
                        (p.operation as u32, p.waitValue.address, p.waitValue.flags)
                    }
                    T::CU_STREAM_MEM_OP_BARRIER => (p.operation as u32, 0, 0),
                    _ => (p.operation as u32, p.writeValue.address, 0),
                }
            }
        })
        .collect()
}

/// The host addresses of `ops`, as a CPU executor uses them.
fn host_addrs(ops: &Ops) -> Vec<u64> {
    ops.as_slice()
        .iter()
        .filter_map(|op| match *op {
            Op::Write32 { addr, .. }
            | Op::Write64 { addr, .. }
            | Op::Doorbell { addr, .. }
            | Op::Wait32 { addr, .. }
            | Op::Wait64 { addr, .. } => Some(addr),
            Op::Barrier | Op::Copy { .. } => None,
        })
        .collect()
}

/// Asserts that the stream runs every op of `ops` at the GPUs' address of its host address.
fn assert_stream_uses_gpu_addresses(ops: &Ops, what: &str) {
    let got: Vec<u64> = params(ops, &h200())
        .into_iter()
        .filter(|p| p.1 != 0)
        .map(|p| p.1)
        .collect();
    let want: Vec<u64> = host_addrs(ops).into_iter().map(gpu).collect();
    assert_eq!(got, want, "{what}: stream addresses");
}

#[test]
fn ring_memory_answers_the_address_its_mapper_gave() {
    let m = RingMem::new(4096, Some(&Arc::new(OffsetMapper)));
    assert!(m.gpu_mapped());
    assert_eq!(m.gpu_addr(64), gpu(m.addr(64)));
    // Someone else's pages (a device's doorbell page) mapped as I/O memory.
    let pages = Arc::new(RingMem::host(4096));
    // SAFETY: `pages` keeps the memory allocated while the wrapper lives.
    let (mut held, off) = unsafe { RingMem::held(pages.addr(0x40), 8, pages.clone()) };
    assert_eq!(
        held.gpu_addr(off),
        held.addr(off),
        "not mapped: host address"
    );
    held.map_for_gpus(&Arc::new(OffsetMapper), true).unwrap();
    assert_eq!(held.gpu_addr(off), gpu(pages.addr(0x40)));
    // An op's word is looked up in the memory that holds it, never at another's end.
    let end = m.addr(0) + m.len() as u64;
    assert_eq!(m.gpu_addr_of(end - 4), Some(gpu(end - 4)));
    assert_eq!(m.gpu_addr_of(end), None);
    assert_eq!(m.gpu_addr_of(m.addr(0) - 1), None);
}

#[test]
fn stream_memops_resolve_the_memory_each_op_names() {
    let m: Arc<RingMem> = Arc::new(RingMem::new(4096, Some(&Arc::new(OffsetMapper))));
    let keep: crate::ops::KeepAlive = m.clone();
    let mut ops = Ops::new();
    ops.push(
        Op::Write32 {
            addr: m.addr(8),
            value: 1,
        },
        &keep,
    );
    ops.push(Op::Barrier, &keep);
    ops.push(
        Op::Write64 {
            addr: m.addr(16),
            value: 2,
        },
        &keep,
    );
    let cond = crate::ops::WaitCond::Geq;
    ops.push(
        Op::Wait32 {
            addr: m.addr(32),
            value: 3,
            cond,
        },
        &keep,
    );
    ops.push(
        Op::Wait64 {
            addr: m.addr(40),
            value: 3,
            cond,
        },
        &keep,
    );
    // An address the list does not keep (device memory, say) is taken as given.
    // SAFETY: never run; only translated.
    unsafe {
        ops.push_raw(Op::Write32 {
            addr: 0x1234_0000,
            value: 4,
        })
    };
    let p = params(&ops, &h200());
    let addrs: Vec<u64> = p.iter().map(|x| x.1).collect();
    let want = [
        gpu(m.addr(8)),
        gpu(m.addr(16)),
        gpu(m.addr(32)),
        gpu(m.addr(40)),
        0x1234_0000,
    ];
    assert_eq!(addrs, want, "the barrier before a write is elided");
    // Without 64-bit memops: two 32-bit writes at the GPU address and 4 past it.
    let no64 = GpuCaps {
        mem_ops_64: false,
        ..h200()
    };
    let mut w = Ops::new();
    w.push(
        Op::Write64 {
            addr: m.addr(16),
            value: 2,
        },
        &keep,
    );
    let p: Vec<u64> = params(&w, &no64).iter().map(|x| x.1).collect();
    assert_eq!(p, [gpu(m.addr(16)), gpu(m.addr(16)) + 4]);
    // The CPU's view is untouched.
    assert_eq!(host_addrs(&w), [m.addr(16)]);
}

#[test]
fn waits_flush_inbound_writes_only_where_the_gpu_can_flush_and_does_not_order_them() {
    let flush = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_FLUSH as u32;
    let m: Arc<RingMem> = Arc::new(RingMem::host(4096));
    let keep: crate::ops::KeepAlive = m.clone();
    let mut ops = Ops::new();
    let (cond, value) = (crate::ops::WaitCond::And, 1);
    ops.push(
        Op::Wait32 {
            addr: m.addr(60),
            value,
            cond,
        },
        &keep,
    );
    ops.push(
        Op::Write32 {
            addr: m.addr(0),
            value,
        },
        &keep,
    );
    let flags = |caps: GpuCaps| -> Vec<u32> { params(&ops, &caps).iter().map(|p| p.2).collect() };
    let and = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_AND as u32;
    // Can flush, does not order: the wait flushes (the write carries no flag).
    let unordered = GpuCaps {
        flush_remote_writes: true,
        gpudirect_rdma_writes_ordering: 0,
        ..h200()
    };
    assert_eq!(flags(unordered), [and | flush, 0]);
    // Orders to the owner (H100/H200), with or without a flush: none.
    assert_eq!(flags(h200()), [and, 0]);
    let both = GpuCaps {
        flush_remote_writes: true,
        ..h200()
    };
    assert_eq!(flags(both), [and, 0]);
    // Neither: no flag (GPU memory is refused as a write target at registration instead).
    let neither = GpuCaps {
        gpudirect_rdma_writes_ordering: 0,
        ..h200()
    };
    assert_eq!(flags(neither), [and, 0]);
}

/// Maps every memory of the QP's rings, records, doorbell and CQs with the fake mapper.
fn fake_map(qp: &crate::Qp) {
    let s = &*qp.shared;
    let cqs = [&s.send_cq, &s.recv_cq];
    let mems = [&s.buf, &s.ctrl, &s.dbrec.mem, &s.doorbell.mem]
        .into_iter()
        .chain(cqs.iter().flat_map(|c| [&c.ring, &c.ctrl, &c.dbrec.mem]));
    for m in mems {
        m.fake_gpu_map(gpu(m.addr(0)));
    }
}

#[test]
fn commits_waits_and_kernel_descriptors_carry_the_gpu_address_and_the_cpu_the_host_one() {
    let dev = Device::soft_with_cuda(None).unwrap();
    let pd = dev.alloc_pd();
    let cqs: Vec<_> = (0..3).map(|_| dev.create_cq(256).unwrap()).collect();
    let mut a = pd
        .create_qp(&cqs[0], &cqs[1], &QpConfig::default())
        .unwrap();
    let mut b = pd
        .create_qp(&cqs[2], &cqs[2], &QpConfig::default())
        .unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    fake_map(&a);
    let src = pd
        .register(Box::leak(vec![7u8; 8].into_boxed_slice()), Access::empty())
        .unwrap();
    let dst = Box::leak(vec![0u8; 8].into_boxed_slice());
    let dst_mr = pd
        .register(dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let wr = SendWr::write(dst_mr.remote().at(0)).sge(src.sge(0..8));
    let prepared = a.prepare_send(&wr).unwrap();
    let (ticket, commit) = a.commit(prepared).unwrap();
    let wait = a.send_wait_ops(&ticket).unwrap();
    let s = &*a.shared;
    // The commit as a CPU executor runs it: the host addresses of the record / doorbell (or
    // of the proxy's word).
    let host = host_addrs(&commit);
    match s.handler {
        NicHandler::Gpu => assert_eq!(
            host,
            [
                s.dbrec.addr() + 4,
                s.doorbell.addr(),
                s.ctrl.addr(QP_SQ_RUNG)
            ]
        ),
        NicHandler::Cpu => assert_eq!(host, [s.ctrl.addr(QP_PROXY)]),
    }
    // As a stream and a kernel's descriptor ring see it: the GPUs' addresses.
    assert_stream_uses_gpu_addresses(&commit, "commit");
    let d = SendDesc::from_ops(&commit).unwrap();
    match s.handler {
        NicHandler::Gpu => {
            assert_eq!(d.db, gpu(host[1]), "kernel send descriptor: doorbell");
            assert_eq!(d.rung, gpu(host[2]), "kernel send descriptor: rung to");
        }
        NicHandler::Cpu => assert_eq!(d.db, gpu(host[0]), "kernel send descriptor"),
    }
    assert_eq!(d.dbrec, if host.len() == 3 { gpu(host[0]) } else { 0 });
    assert_stream_uses_gpu_addresses(&wait, "send wait");
    let w = WaitDesc::from_ops(&wait).unwrap();
    let wh = host_addrs(&wait);
    assert_eq!(
        [w.word, w.ci_rec, w.retired],
        [gpu(wh[0]), gpu(wh[1]), gpu(wh[2])],
        "kernel wait descriptor"
    );
    assert_eq!(wh[2], s.ctrl.addr(QP_SQ_RETIRED));
    // The CPU runs both lists at the host addresses: the write lands and completes.
    HostExecutor::default().submit(commit).unwrap();
    HostExecutor::default().submit(wait).unwrap();
    let mut got = [0u8; 8];
    dst_mr.read_at(0, &mut got);
    assert_eq!(got, [7u8; 8]);
    assert_kernel_desc_is_gpu_addressed(a);
}

/// The kernel QP descriptor: every pointer at the GPUs' address.
fn assert_kernel_desc_is_gpu_addressed(a: crate::Qp) {
    let (buf, ctrl, dbrec, doorbell) = {
        let s = &*a.shared;
        (
            s.buf.clone(),
            s.ctrl.clone(),
            s.dbrec.clone(),
            s.doorbell.clone(),
        )
    };
    let (scq, rcq) = (a.shared.send_cq.clone(), a.shared.recv_cq.clone());
    let sq_off = a.shared.sq_off;
    let handler = a.shared.handler;
    let d = a.into_device().unwrap().desc();
    assert_eq!(
        [d.sq, d.rq, d.dbrec, d.state],
        [
            gpu(buf.addr(sq_off)),
            gpu(buf.addr(0)),
            gpu(dbrec.addr()),
            gpu(ctrl.addr(QP_KERNEL_SQ_PI))
        ]
    );
    match handler {
        NicHandler::Gpu => assert_eq!((d.db, d.proxy), (gpu(doorbell.addr()), 0)),
        NicHandler::Cpu => assert_eq!((d.db, d.proxy), (0, gpu(ctrl.addr(QP_PROXY)))),
    }
    for (c, cq, retired) in [
        (d.send_cq, &scq, QP_SQ_RETIRED),
        (d.recv_cq, &rcq, QP_RQ_RETIRED),
    ] {
        assert_eq!(
            [c.cqes, c.dbrec, c.retired, c.wq_retired],
            [
                gpu(cq.ring.addr(0)),
                gpu(cq.dbrec.addr()),
                gpu(cq.ctrl.addr(crate::cq::CQ_RETIRED)),
                gpu(ctrl.addr(retired))
            ]
        );
    }
}

/// A copy is no stream memory operation: translating a list with one directly is refused with
/// an error that names the way (the executor, which copies between batches), never a batch
/// that silently skips the copy.
#[test]
fn a_copy_is_refused_by_the_memory_operation_batch() {
    let b = crate::PinnedBuffer::with_cuda(64, None);
    let mut ops = b.write32(0, 1);
    let copy = Op::Copy {
        dst: b.addr() + 8,
        src: b.addr() + 16,
        len: 8,
    };
    // SAFETY: never run.
    unsafe { ops.push_raw(copy) };
    let Err(e) = translate(&ops, &h200()) else {
        panic!("a list with a copy was translated");
    };
    let e = e.to_string();
    assert!(e.contains("Executor::submit"), "{e}");
}

//! The FFI struct layouts the control path relies on, checked against the sizes and offsets
//! rdma-core 44's headers give on x86-64 (measured with a C
//! `offsetof` program) (bindgen's own compile-time checks cover every field;
//! these pin the ones libmlx5 writes through, independently of the generated file).

use super::sys;
use crate::Access;
use std::mem::{offset_of, size_of};

#[test]
fn mlx5dv_qp_and_cq_have_the_documented_layout() {
    assert_eq!(size_of::<sys::mlx5dv_qp>(), 96);
    assert_eq!(offset_of!(sys::mlx5dv_qp, dbrec), 0);
    assert_eq!(offset_of!(sys::mlx5dv_qp, sq), 8);
    assert_eq!(offset_of!(sys::mlx5dv_qp, rq), 24);
    assert_eq!(offset_of!(sys::mlx5dv_qp, bf), 40);
    assert_eq!(offset_of!(sys::mlx5dv_qp, comp_mask), 56);
    assert_eq!(size_of::<sys::mlx5dv_cq>(), 48);
    assert_eq!(offset_of!(sys::mlx5dv_cq, cqe_cnt), 16);
    assert_eq!(offset_of!(sys::mlx5dv_cq, cqn), 32);
    // Pairs of {in, out}: QP first, then CQ (libmlx5 reads only the pairs selected).
    assert_eq!(offset_of!(sys::mlx5dv_obj, qp), 0);
    assert_eq!(offset_of!(sys::mlx5dv_obj, cq), 16);
    assert_eq!(size_of::<sys::mlx5dv_obj>(), 112);
}

#[test]
fn verbs_structs_have_the_abi_layout() {
    assert_eq!(size_of::<sys::ibv_port_attr>(), 52);
    assert_eq!(offset_of!(sys::ibv_port_attr, lid), 34);
    assert_eq!(offset_of!(sys::ibv_port_attr, link_layer), 46);
    assert_eq!(size_of::<sys::ibv_gid_entry>(), 32);
    assert_eq!(size_of::<sys::ibv_device_attr>(), 232);
    assert_eq!(offset_of!(sys::ibv_device_attr, phys_port_cnt), 227);
    assert_eq!(size_of::<sys::ibv_qp_attr>(), 144);
    assert_eq!(offset_of!(sys::ibv_qp_attr, ah_attr), 56);
    // The context is the last member of verbs_context, right after its size.
    assert_eq!(offset_of!(sys::verbs_context, sz), 312);
    assert_eq!(offset_of!(sys::verbs_context, context), 320);
    assert_eq!(offset_of!(sys::ibv_context, abi_compat), 320);
}

#[test]
fn access_flags_are_the_verbs_bits() {
    assert_eq!(Access::LOCAL_WRITE.bits(), sys::IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(Access::REMOTE_WRITE.bits(), sys::IBV_ACCESS_REMOTE_WRITE);
    assert_eq!(Access::REMOTE_READ.bits(), sys::IBV_ACCESS_REMOTE_READ);
    assert_eq!(Access::REMOTE_ATOMIC.bits(), sys::IBV_ACCESS_REMOTE_ATOMIC);
}

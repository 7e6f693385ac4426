//! The emulated driver's ioctl ABI: write commands carried over `RDMA_VERBS_IOCTL`
//! (`DEVICE/INVOKE_WRITE`, the path libibverbs takes on a current kernel) are served and
//! counted as ioctl commands, and their attribute TLVs are validated as the kernel does:
//! unknown mandatory attributes EPROTONOSUPPORT, unknown optional ones skipped, duplicates,
//! reserved bits and missing attributes EINVAL, short responses ENOSPC, bad pointers EFAULT.
//! Raw ioctls on the emulated `/dev/infiniband/uverbs0`, in a child under the emulator.

use std::ffi::c_void;
use uverbs_emu::command_stream::Stream;
use uverbs_emu::control::{ioctl_command_count, Command};
use uverbs_emu::{in_child_under_emulator, in_child_under_emulator_with};

/// `RDMA_VERBS_IOCTL`: `_IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)`.
const RDMA_VERBS_IOCTL: u64 = 0xc018_1b01;
/// `ib_user_ioctl_cmds.h`: CORE_IN, CORE_OUT, WRITE_CMD; UHW_IN, UHW_OUT (driver namespace).
const CORE_IN: u16 = 0;
const CORE_OUT: u16 = 1;
const WRITE_CMD: u16 = 2;
const UHW_OUT: u16 = 0x1001;
const MANDATORY: u16 = 1;
const ALLOC_PD: u64 = 3;

/// One `ib_uverbs_attr`: id, len, flags, reserved, data.
fn attr(id: u16, len: u16, flags: u16, data: u64) -> [u64; 2] {
    [id as u64 | (len as u64) << 16 | (flags as u64) << 32, data]
}

/// Issues DEVICE/INVOKE_WRITE with `attrs`; Ok or the errno.
fn invoke(fd: i32, attrs: &[[u64; 2]]) -> Result<(), i32> {
    let n = attrs.len();
    let mut buf = vec![(24 + 16 * n) as u64 | (n as u64) << 48, 0, 0];
    buf.extend(attrs.iter().flatten());
    // SAFETY: a header and `n` attributes in `buf`; the emulator reads only those.
    let rc = unsafe { libc::ioctl(fd, RDMA_VERBS_IOCTL, buf.as_mut_ptr().cast::<c_void>()) };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
    }
}

/// In the test's process: runs test `name` in a child under the emulator and returns None.
/// In that child: the emulated device opened, with a context made by `GET_CONTEXT` by
/// write() (header: command 0, in_words 4, out_words 64; then the response pointer), and the
/// address of the response buffer.
fn context_in_child(name: &str) -> Option<(Stream, u64)> {
    if in_child_under_emulator(name, "mlx5_0") {
        return None;
    }
    let s = Stream::open(c"/dev/infiniband/uverbs0").expect("open the emulated device");
    let resp = s.resp as u64;
    let get = [4u64 << 32 | 64 << 48, resp];
    // SAFETY: 16 bytes of a live array.
    let n = unsafe { libc::write(s.fd, get.as_ptr().cast(), 16) };
    assert_eq!(n, 16, "GET_CONTEXT");
    Some((s, resp))
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn write_commands_over_ioctl_are_served_and_malformed_ones_refused() {
    let Some((s, resp)) =
        context_in_child("write_commands_over_ioctl_are_served_and_malformed_ones_refused")
    else {
        return;
    };
    let r = resp.to_ne_bytes();
    // Then ALLOC_PD over ioctl.
    // core in: ALLOC_PD's request is its (unused over ioctl) response pointer, 8 B inline.
    let core_in = attr(CORE_IN, 8, MANDATORY, u64::from_ne_bytes(r));
    let cmd = attr(WRITE_CMD, 8, MANDATORY, ALLOC_PD);
    let out = attr(CORE_OUT, 8, 0, resp);
    let before = ioctl_command_count(Command::AllocPd).unwrap();
    if std::env::var("UVEMU_ABI").as_deref() == Ok("write") {
        // The legacy ABI: a kernel without INVOKE_WRITE, so libibverbs keeps to write().
        assert_eq!(
            invoke(s.fd, &[core_in, out, cmd]),
            Err(libc::EPROTONOSUPPORT)
        );
        assert_eq!(ioctl_command_count(Command::AllocPd).unwrap(), before);
        return;
    }
    assert_eq!(invoke(s.fd, &[core_in, out, cmd]), Ok(()));
    assert_eq!(ioctl_command_count(Command::AllocPd).unwrap(), before + 1);
    // An unknown optional attribute is skipped; an unknown mandatory one refused.
    assert_eq!(
        invoke(s.fd, &[core_in, out, cmd, attr(0x77, 8, 0, 0)]),
        Ok(())
    );
    assert_eq!(
        invoke(s.fd, &[core_in, out, cmd, attr(0x77, 8, MANDATORY, 0)]),
        Err(libc::EPROTONOSUPPORT)
    );
    assert_eq!(
        invoke(s.fd, &[core_in, out, cmd, cmd]),
        Err(libc::EINVAL),
        "twice"
    );
    assert_eq!(
        invoke(s.fd, &[core_in, out]),
        Err(libc::EINVAL),
        "no command"
    );
    assert_eq!(
        invoke(s.fd, &[out, cmd]),
        Err(libc::EINVAL),
        "no core input"
    );
    assert_eq!(
        invoke(s.fd, &[core_in, attr(CORE_OUT, 2, 0, resp), cmd]),
        Err(libc::ENOSPC),
        "response too short"
    );
    assert_eq!(
        invoke(s.fd, &[core_in, attr(CORE_OUT, 8, 0, 16), cmd]),
        Err(libc::EFAULT)
    );
    assert_eq!(
        invoke(s.fd, &[core_in, attr(UHW_OUT, 64, 0, 16), out, cmd]),
        Err(libc::EFAULT)
    );
    assert_eq!(
        invoke(s.fd, &[attr(CORE_IN, 4000, 0, 16), out, cmd]),
        Err(libc::EFAULT)
    );
    assert_eq!(
        invoke(s.fd, &[attr(CORE_IN, 4, 0, 0), out, cmd]),
        Err(libc::EINVAL),
        "short"
    );
    assert_eq!(
        invoke(s.fd, &[core_in, out, attr(WRITE_CMD, 8, 4, ALLOC_PD)]),
        Err(libc::EINVAL)
    );
    assert_eq!(
        invoke(s.fd, &[core_in, out, attr(WRITE_CMD, 8, 0, 1 << 40)]),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(
        ioctl_command_count(Command::AllocPd).unwrap(),
        before + 2,
        "only the good ones"
    );
}

/// `mlx5_user_ioctl_cmds.h`: the UAR object, its methods and attributes.
const OBJECT_UAR: u16 = 0x1008;
const UAR_ALLOC: u16 = 0x1000;
const UAR_DESTROY: u16 = 0x1001;
const UAR_HANDLE: u16 = 0x1000;
const UAR_TYPE: u16 = 0x1001;
const UAR_OFFSET: u16 = 0x1002;
const UAR_LENGTH: u16 = 0x1003;
const UAR_PAGE_ID: u16 = 0x1004;
/// `enum mlx5_ib_uapi_uar_alloc_type`.
const UAR_TYPE_BF: u64 = 0;
const UAR_TYPE_NC: u64 = 1;
/// `MLX5_LIB_CAP_DYN_UAR`: the library allocates its UARs.
const LIB_CAP_DYN_UAR: u64 = 2;

/// Issues `object`/`method` with `attrs`, the attributes as the driver left them, or the errno.
fn method(fd: i32, object: u16, method: u16, attrs: &[[u64; 2]]) -> Result<Vec<[u64; 2]>, i32> {
    let n = attrs.len();
    let hdr =
        (24 + 16 * n) as u64 | (object as u64) << 16 | (method as u64) << 32 | (n as u64) << 48;
    let mut buf = vec![hdr, 0, 0];
    buf.extend(attrs.iter().flatten());
    // SAFETY: a header and `n` attributes in `buf`; the emulator reads and writes only those.
    let rc = unsafe { libc::ioctl(fd, RDMA_VERBS_IOCTL, buf.as_mut_ptr().cast::<c_void>()) };
    match rc {
        0 => Ok(buf[3..].chunks(2).map(|c| [c[0], c[1]]).collect()),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
    }
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn dynamic_uars_are_allocated_mapped_and_destroyed_as_the_kernel_does() {
    let name = "dynamic_uars_are_allocated_mapped_and_destroyed_as_the_kernel_does";
    if in_child_under_emulator_with(name, "mlx5_0", &[("UVEMU_WC", "0")]) {
        return;
    }
    let s = Stream::open(c"/dev/infiniband/uverbs0").expect("open the emulated device");
    let resp = s.resp as u64;
    // GET_CONTEXT by write() with libmlx5's request (mlx5_ib_alloc_ucontext_req_v2: 16
    // bfregs, 4 low-latency, CQE version 1, lib_caps DYN_UAR): header, response pointer,
    // then 32 bytes of driver data.
    let get = [
        12u64 << 32 | 64 << 48,
        resp,
        16 | 4 << 32,
        0,
        1,
        LIB_CAP_DYN_UAR,
    ];
    // SAFETY: 48 bytes of a live array.
    let n = unsafe { libc::write(s.fd, get.as_ptr().cast(), 48) };
    assert_eq!(n, 48, "GET_CONTEXT");
    let (mut off, mut len, mut page) = (0u64, 0u32, 0u32);
    let at = [
        std::ptr::addr_of_mut!(off) as u64,
        std::ptr::addr_of_mut!(len) as u64,
        std::ptr::addr_of_mut!(page) as u64,
    ];
    let outs = |t: u64| {
        [
            attr(UAR_HANDLE, 0, MANDATORY, 0),
            attr(UAR_TYPE, 8, MANDATORY, t),
            attr(UAR_OFFSET, 8, MANDATORY, at[0]),
            attr(UAR_LENGTH, 4, MANDATORY, at[1]),
            attr(UAR_PAGE_ID, 4, MANDATORY, at[2]),
        ]
    };
    let nc = outs(UAR_TYPE_NC);
    if std::env::var("UVEMU_ABI").as_deref() == Ok("write") {
        // An older kernel has no UAR object: libmlx5 keeps to the context's bfregs (as it
        // does on a host with write-combining, where the object is not served either).
        assert_eq!(
            method(s.fd, OBJECT_UAR, UAR_ALLOC, &nc),
            Err(libc::EPROTONOSUPPORT)
        );
        return;
    }
    // BlueFlame UARs need write-combining, which this host has not.
    assert_eq!(
        method(s.fd, OBJECT_UAR, UAR_ALLOC, &outs(UAR_TYPE_BF)),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(
        method(s.fd, OBJECT_UAR, UAR_ALLOC, &nc[1..]),
        Err(libc::EINVAL),
        "no handle"
    );
    assert_eq!(
        method(
            s.fd,
            OBJECT_UAR,
            UAR_ALLOC,
            &[nc[0], nc[1], nc[2], nc[3], nc[4], nc[4]]
        ),
        Err(libc::EINVAL),
        "twice"
    );
    let got = method(s.fd, OBJECT_UAR, UAR_ALLOC, &nc).expect("a non-cached UAR");
    let handle = got[0][1];
    assert_eq!(len, 4096);
    assert!(
        page != 0 && off % 4096 == 0,
        "page {page:#x} offset {off:#x}"
    );
    // The offset maps the doorbell page (once).
    // SAFETY: a fresh mapping of the emulated device's UAR; unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_WRITE,
            libc::MAP_SHARED,
            s.fd,
            off as i64,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap of the UAR's offset");
    // SAFETY: the same offset again, refused (nothing mapped on success is left: unmapped).
    let again = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_WRITE,
            libc::MAP_SHARED,
            s.fd,
            off as i64,
        )
    };
    assert_eq!(again, libc::MAP_FAILED);
    let destroy = [attr(UAR_HANDLE, 0, MANDATORY, handle)];
    assert_eq!(
        method(s.fd, OBJECT_UAR, UAR_DESTROY, &destroy).map(|_| ()),
        Ok(())
    );
    assert_eq!(
        method(s.fd, OBJECT_UAR, UAR_DESTROY, &destroy),
        Err(libc::EINVAL),
        "destroyed already"
    );
    // SAFETY: the mapping made above.
    assert_eq!(unsafe { libc::munmap(p, 4096) }, 0);
}

/// `IB_USER_VERBS_CMD_FLAG_EXTENDED` and the extended `QUERY_DEVICE`.
const EXTENDED: u64 = 0x8000_0000;
const QUERY_DEVICE: u64 = 1;

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn extended_query_device_over_ioctl_is_answered_as_the_kernel_does() {
    let Some((s, _)) =
        context_in_child("extended_query_device_over_ioctl_is_answered_as_the_kernel_does")
    else {
        return;
    };
    // ib_uverbs_ex_query_device: comp_mask and reserved, 8 B inline; the response into a
    // buffer of 320 B (the base attributes, comp_mask, response_length, the extensions: 304
    // B in this kernel ABI).
    let mut out = [0xffu8; 320];
    let core_in = attr(CORE_IN, 8, MANDATORY, 0);
    let cmd = attr(WRITE_CMD, 8, MANDATORY, EXTENDED | QUERY_DEVICE);
    let core_out = attr(CORE_OUT, 320, 0, out.as_mut_ptr() as u64);
    let before = uverbs_emu::control::ioctl_ex_command_count(1).unwrap();
    if std::env::var("UVEMU_ABI").as_deref() == Ok("write") {
        assert_eq!(
            invoke(s.fd, &[core_in, core_out, cmd]),
            Err(libc::EPROTONOSUPPORT)
        );
        return;
    }
    assert_eq!(invoke(s.fd, &[core_in, core_out, cmd]), Ok(()));
    assert_eq!(
        uverbs_emu::control::ioctl_ex_command_count(1).unwrap(),
        before + 1
    );
    // The base: fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap (u64s), then
    // vendor_id (Mellanox).
    assert_eq!(u32::from_ne_bytes(out[40..44].try_into().unwrap()), 0x02c9);
    // response_length (after the 176-byte base and comp_mask): what the kernel filled, at
    // most the buffer; past it, zeros, not the 0xff the buffer held.
    let len = u32::from_ne_bytes(out[180..184].try_into().unwrap()) as usize;
    assert!((184..=304).contains(&len), "response_length {len}");
    assert!(out[len..].iter().all(|&b| b == 0), "the rest is cleared");
    // A core response shorter than the base and response_length: ENOSPC.
    let short = attr(CORE_OUT, 100, 0, out.as_mut_ptr() as u64);
    assert_eq!(invoke(s.fd, &[core_in, short, cmd]), Err(libc::ENOSPC));
    // An extended command the driver lacks (CREATE_FLOW, 50): EOPNOTSUPP, as a kernel without it.
    let flow = attr(WRITE_CMD, 8, MANDATORY, EXTENDED | 50);
    assert_eq!(
        invoke(s.fd, &[core_in, core_out, flow]),
        Err(libc::EOPNOTSUPP)
    );
}

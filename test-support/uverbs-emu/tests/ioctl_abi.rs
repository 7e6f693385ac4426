//! The emulated driver's ioctl ABI: write commands carried over `RDMA_VERBS_IOCTL`
//! (`DEVICE/INVOKE_WRITE`, the path libibverbs takes on a current kernel) are served and
//! counted as ioctl commands, and their attribute TLVs are validated as the kernel does:
//! unknown mandatory attributes EPROTONOSUPPORT, unknown optional ones skipped, duplicates,
//! reserved bits and missing attributes EINVAL, short responses ENOSPC, bad pointers EFAULT.
//! mlx5's dynamic UARs (`MLX5_IB_OBJECT_UAR`) are allocated, mapped and destroyed as a
//! current kernel serves them, with the same attribute checks.
//! Raw ioctls on the emulated `/dev/infiniband/uverbs0`, in a child under the emulator.

use std::ffi::c_void;
use uverbs_emu::command_stream::Stream;
use uverbs_emu::control::{ioctl_command_count, native_command_count, Command};
use uverbs_emu::in_child_under_emulator;

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
    method(fd, 0, 0, attrs).map(|_| ())
}

/// Issues method `method` of object `object` with `attrs`; the attributes as the driver
/// left them (outputs' flags, a new object's handle), or the errno.
fn method(fd: i32, object: u16, method: u16, attrs: &[[u64; 2]]) -> Result<Vec<[u64; 2]>, i32> {
    let n = attrs.len();
    let head = (24 + 16 * n) as u64 | (object as u64) << 16 | (method as u64) << 32;
    let mut buf = vec![head | (n as u64) << 48, 0, 0];
    buf.extend(attrs.iter().flatten());
    // SAFETY: a header and `n` attributes in `buf`; the emulator reads only those.
    let rc = unsafe { libc::ioctl(fd, RDMA_VERBS_IOCTL, buf.as_mut_ptr().cast::<c_void>()) };
    match rc {
        0 => Ok(buf[3..].chunks(2).map(|a| [a[0], a[1]]).collect()),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
    }
}

/// `mlx5_user_ioctl_cmds.h`: MLX5_IB_OBJECT_UAR, its ALLOC and DESTROY methods; ALLOC's
/// attributes (handle, type, mmap offset, mmap length, page id) and DESTROY's handle.
const OBJECT_UAR: u16 = 0x1008;
const UAR_ALLOC: u16 = 0x1000;
const UAR_DESTROY: u16 = 0x1001;
const UAR_ATTR: [u16; 5] = [0x1000, 0x1001, 0x1002, 0x1003, 0x1004];
/// `MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF` and `_NC`.
const UAR_BF: u64 = 0;
const UAR_NC: u64 = 1;

/// Maps `len` bytes of the device at `offset`: the address or the errno.
fn map(fd: i32, len: usize, offset: u64) -> Result<*mut c_void, i32> {
    // SAFETY: a fresh shared mapping of the device; nothing of the process is replaced.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            offset as i64,
        )
    };
    match p {
        libc::MAP_FAILED => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
        p => Ok(p),
    }
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn write_commands_over_ioctl_are_served_and_malformed_ones_refused() {
    if in_child_under_emulator(
        "write_commands_over_ioctl_are_served_and_malformed_ones_refused",
        "mlx5_0",
    ) {
        return;
    }
    let s = Stream::open(c"/dev/infiniband/uverbs0").expect("open the emulated device");
    let resp = s.resp as u64;
    let r = resp.to_ne_bytes();
    // GET_CONTEXT by write() (header: command 0, in_words 4, out_words 64; then the
    // response pointer); then ALLOC_PD over ioctl.
    let get = [4u64 << 32 | 64 << 48, resp];
    // SAFETY: 16 bytes of a live array.
    let n = unsafe { libc::write(s.fd, get.as_ptr().cast(), 16) };
    assert_eq!(n, 16, "GET_CONTEXT");
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

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn dynamic_uars_are_allocated_mapped_and_destroyed_as_a_current_kernel_does() {
    if in_child_under_emulator(
        "dynamic_uars_are_allocated_mapped_and_destroyed_as_a_current_kernel_does",
        "mlx5_0",
    ) {
        return;
    }
    let s = Stream::open(c"/dev/infiniband/uverbs0").expect("open the emulated device");
    let get = [4u64 << 32 | 64 << 48, s.resp as u64];
    // SAFETY: 16 bytes of a live array.
    assert_eq!(unsafe { libc::write(s.fd, get.as_ptr().cast(), 16) }, 16);
    let (mut offset, mut length, mut page_id) = (0u64, 0u32, 0u32);
    let outs = [
        (&mut offset as *mut u64).cast::<c_void>(),
        (&mut length as *mut u32).cast(),
        (&mut page_id as *mut u32).cast(),
    ];
    let alloc = |ty: u64, lens: [u16; 3], at: [u64; 3]| {
        let mut attrs = vec![
            attr(UAR_ATTR[0], 0, MANDATORY, 0),
            attr(UAR_ATTR[1], 8, MANDATORY, ty),
        ];
        for k in 0..3 {
            attrs.push(attr(UAR_ATTR[2 + k], lens[k], MANDATORY, at[k]));
        }
        method(s.fd, OBJECT_UAR, UAR_ALLOC, &attrs)
    };
    let at = outs.map(|p| p as u64);
    if std::env::var("UVEMU_ABI").as_deref() == Ok("write") {
        // A kernel of the legacy ABI has no UAR object: libmlx5 keeps to its static pages.
        assert_eq!(alloc(UAR_BF, [8, 4, 4], at), Err(libc::EPROTONOSUPPORT));
        return;
    }
    let attrs = alloc(UAR_BF, [8, 4, 4], at).expect("UAR_OBJ_ALLOC");
    let handle = attrs[0][1];
    assert!(handle > 0);
    assert_eq!(length, 4096);
    assert!(page_id > 0);
    // The offset carries the kernel's mmap-entry command (9) in bits 8..15 of the page offset.
    assert_eq!((offset >> 12 >> 8) & 0xff, 9, "{offset:#x}");
    assert_eq!(
        map(s.fd, 8192, offset),
        Err(libc::EINVAL),
        "longer than the page"
    );
    let page = map(s.fd, 4096, offset).expect("map the UAR page");
    assert_eq!(map(s.fd, 4096, offset), Err(libc::EINVAL), "mapped once");
    // SAFETY: the page just mapped, writable.
    unsafe { page.cast::<u8>().add(0x800).cast::<u64>().write_volatile(1) };
    let bf_offset = offset;
    let nc = alloc(UAR_NC, [8, 4, 4], at).expect("an NC UAR");
    assert_ne!(offset, bf_offset, "a page of its own");
    assert_ne!(nc[0][1], handle);

    assert_eq!(
        alloc(5, [8, 4, 4], at),
        Err(libc::EOPNOTSUPP),
        "unknown type"
    );
    assert_eq!(
        alloc(UAR_BF, [8, 4, 2], at),
        Err(libc::EINVAL),
        "short page id"
    );
    assert_eq!(
        alloc(UAR_BF, [8, 4, 4], [16, at[1], at[2]]),
        Err(libc::EFAULT)
    );
    let a = |k: usize, ty| attr(UAR_ATTR[k], 8, MANDATORY, ty);
    assert_eq!(
        method(s.fd, OBJECT_UAR, UAR_ALLOC, &[a(0, 0), a(1, UAR_BF)]),
        Err(libc::EINVAL),
        "no outputs"
    );
    let destroy = |h: u64| {
        method(
            s.fd,
            OBJECT_UAR,
            UAR_DESTROY,
            &[attr(UAR_ATTR[0], 0, MANDATORY, h)],
        )
    };
    assert_eq!(destroy(handle).map(|_| ()), Ok(()));
    assert_eq!(
        destroy(handle).map(|_| ()),
        Err(libc::ENOENT),
        "destroyed twice"
    );
    assert_eq!(
        map(s.fd, 4096, bf_offset),
        Err(libc::EINVAL),
        "a destroyed UAR's offset"
    );
    // SAFETY: the page mapped above; the UAR is gone, the mapping still the process's.
    assert_eq!(unsafe { libc::munmap(page, 4096) }, 0);
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn extended_commands_over_ioctl_are_answered_as_a_kernel_does() {
    let name = "extended_commands_over_ioctl_are_answered_as_a_kernel_does";
    if in_child_under_emulator(name, "mlx5_0")
        || std::env::var("UVEMU_ABI").as_deref() == Ok("write")
    {
        return;
    }
    let s = Stream::open(c"/dev/infiniband/uverbs0").expect("open the emulated device");
    let get = [4u64 << 32 | 64 << 48, s.resp as u64];
    // SAFETY: 16 bytes of a live array.
    assert_eq!(unsafe { libc::write(s.fd, get.as_ptr().cast(), 16) }, 16);
    // QUERY_DEVICE, then QUERY_DEVICE_EX (the command with IB_USER_VERBS_CMD_FLAG_EXTENDED,
    // its request comp_mask and reserved, both 0, inline): the same device attributes, and
    // the extended response says how long it is.
    const QUERY_DEVICE: u64 = 1;
    const EXTENDED: u64 = 0x8000_0000;
    let (mut legacy, mut ex) = ([0u8; 176], [0u8; 256]);
    let out = |b: &mut [u8]| attr(CORE_OUT, b.len() as u16, 0, b.as_mut_ptr() as u64);
    let core_in = |v: u64| attr(CORE_IN, 8, MANDATORY, v);
    let cmd = |c: u64| attr(WRITE_CMD, 8, MANDATORY, c);
    assert_eq!(
        invoke(s.fd, &[core_in(0), out(&mut legacy), cmd(QUERY_DEVICE)]),
        Ok(())
    );
    assert_eq!(
        invoke(
            s.fd,
            &[core_in(0), out(&mut ex), cmd(EXTENDED | QUERY_DEVICE)]
        ),
        Ok(())
    );
    assert_eq!(ex[..176], legacy[..], "the base attributes");
    let response_length = u32::from_ne_bytes(ex[180..184].try_into().unwrap());
    assert!((184..=256).contains(&response_length), "{response_length}");
    // A request with comp_mask set; a response shorter than response_length's end.
    assert_eq!(
        invoke(
            s.fd,
            &[core_in(1), out(&mut ex), cmd(EXTENDED | QUERY_DEVICE)]
        ),
        Err(libc::EINVAL)
    );
    assert_eq!(
        invoke(
            s.fd,
            &[
                core_in(0),
                out(&mut ex[..100]),
                cmd(EXTENDED | QUERY_DEVICE)
            ]
        ),
        Err(libc::ENOSPC)
    );
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn ioctl_methods_not_served_answer_as_a_kernel_without_them() {
    let name = "ioctl_methods_not_served_answer_as_a_kernel_without_them";
    if in_child_under_emulator(name, "mlx5_0") {
        return;
    }
    let s = Stream::open(c"/dev/infiniband/uverbs0").expect("open the emulated device");
    // What libibverbs and libmlx5 ask on a current kernel and the driver does not serve:
    // DEVICE/QUERY_CONTEXT, mlx5's DEVX_OTHER (the DEVX capability query). EPROTONOSUPPORT, not ENOTTY: the method is unknown, the interface is
    // there. The native methods served on the ioctl ABI (DEVICE/QUERY_PORT, QUERY_GID_TABLE,
    // QUERY_GID_ENTRY, GET_CONTEXT, CQ_CREATE, QP_CREATE, PD_DESTROY) are unknown on the write ABI; on the ioctl ABI a
    // call without their mandatory attributes is EINVAL (GET_CONTEXT has none: it makes the
    // context).
    for (object, m) in [(0, 4), (0x1000, 0x1000)] {
        assert_eq!(
            method(s.fd, object, m, &[]),
            Err(libc::EPROTONOSUPPORT),
            "object {object:#x} method {m:#x}"
        );
    }
    let write_abi = std::env::var("UVEMU_ABI").as_deref() == Ok("write");
    for (object, m) in [(0, 2), (0, 5), (0, 6), (0, 3), (3, 0), (4, 0), (1, 0)] {
        let expected = match (write_abi, object, m) {
            (true, ..) => Err(libc::EPROTONOSUPPORT),
            (false, 0, 3) => Ok(vec![]),
            _ => Err(libc::EINVAL),
        };
        assert_eq!(
            method(s.fd, object, m, &[]),
            expected,
            "object {object:#x} method {m:#x}"
        );
    }
}

/// `ib_user_ioctl_cmds.h`: the objects (DEVICE, PD, CQ, QP, MR, ASYNC_EVENT) and methods
/// served natively; UHW_IN (the driver's request).
const DEVICE: u16 = 0;
const PD: u16 = 1;
const CQ: u16 = 3;
const QP: u16 = 4;
const MR: u16 = 7;
const ASYNC_EVENT: u16 = 16;
const QUERY_PORT: u16 = 2;
const QUERY_GID_TABLE: u16 = 5;
const QUERY_GID_ENTRY: u16 = 6;
const GET_CONTEXT: u16 = 3;
const UHW_IN: u16 = 0x1000;

/// An attribute pointing at `b` (an input or output buffer).
fn buf(id: u16, flags: u16, b: &mut [u8]) -> [u64; 2] {
    attr(id, b.len() as u16, flags, b.as_mut_ptr() as u64)
}

/// DEVICE/QUERY_PORT of `port` into `resp`, with `extra` attributes.
fn query_port(fd: i32, port: u64, resp: &mut [u8], extra: &[[u64; 2]]) -> Result<(), i32> {
    let mut attrs = vec![attr(0, 8, MANDATORY, port), buf(1, MANDATORY, resp)];
    attrs.extend_from_slice(extra);
    method(fd, DEVICE, QUERY_PORT, &attrs).map(|_| ())
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn native_methods_decode_as_the_kernel_does_and_refuse_malformed_attributes() {
    let name = "native_methods_decode_as_the_kernel_does_and_refuse_malformed_attributes";
    if in_child_under_emulator(name, "mlx5_0") {
        return;
    }
    let s = Stream::open(c"/dev/infiniband/uverbs0").expect("open the emulated device");
    if std::env::var("UVEMU_ABI").as_deref() == Ok("write") {
        assert_eq!(
            method(s.fd, DEVICE, GET_CONTEXT, &[]),
            Err(libc::EPROTONOSUPPORT)
        );
        return;
    }
    let mut resp = [0u8; 48];
    assert_eq!(
        query_port(s.fd, 1, &mut resp, &[]),
        Err(libc::EINVAL),
        "no context yet"
    );
    // A context whose answer cannot be written is not made: the next GET_CONTEXT succeeds.
    assert_eq!(
        method(s.fd, DEVICE, GET_CONTEXT, &[attr(0, 4, 0, 16)]).map(|_| ()),
        Err(libc::EFAULT),
        "unwritable NUM_COMP_VECTORS"
    );
    // The context, then its async event file (once).
    let mut vectors = [0u8; 4];
    assert_eq!(
        method(s.fd, DEVICE, GET_CONTEXT, &[buf(0, 0, &mut vectors)]).map(|_| ()),
        Ok(())
    );
    assert_eq!(u32::from_ne_bytes(vectors), 4);
    assert_eq!(
        method(s.fd, DEVICE, GET_CONTEXT, &[]),
        Err(libc::EINVAL),
        "one context per open"
    );
    let async_fd = attr(0, 0, MANDATORY, 0);
    let got = method(s.fd, ASYNC_EVENT, 0, &[async_fd]).unwrap();
    // SAFETY: fcntl on a descriptor number: F_GETFD only asks whether it is open.
    assert!(unsafe { libc::fcntl(got[0][1] as i32, libc::F_GETFD) } >= 0);
    assert_eq!(method(s.fd, ASYNC_EVENT, 0, &[async_fd]), Err(libc::EINVAL));
    assert_eq!(method(s.fd, ASYNC_EVENT, 0, &[]), Err(libc::EINVAL));

    // QUERY_PORT: the legacy response, and the speed again in active_speed_ex (byte 44).
    assert_eq!(query_port(s.fd, 1, &mut resp, &[]), Ok(()));
    assert_eq!(resp[26], 4, "state ACTIVE");
    assert_eq!(
        u32::from_ne_bytes(resp[44..48].try_into().unwrap()),
        resp[35] as u32
    );
    let bad = [
        (
            query_port(s.fd, 9, &mut resp, &[]),
            libc::EINVAL,
            "no port 9",
        ),
        (
            query_port(s.fd, 1 << 8, &mut resp, &[]),
            libc::EINVAL,
            "port wider than u8",
        ),
        (
            query_port(s.fd, 1, &mut resp[..40], &[]),
            libc::EINVAL,
            "response shorter than the kernel's struct",
        ),
        (
            query_port(s.fd, 1, &mut resp, &[attr(0x77, 8, MANDATORY, 0)]),
            libc::EPROTONOSUPPORT,
            "unknown mandatory attribute",
        ),
        (
            query_port(s.fd, 1, &mut resp, &[attr(0, 8, 0, 1)]),
            libc::EINVAL,
            "port given twice",
        ),
        (
            query_port(s.fd, 1, &mut resp, &[attr(0x77, 8, 4, 0)]),
            libc::EINVAL,
            "reserved flag",
        ),
        (
            method(
                s.fd,
                DEVICE,
                QUERY_PORT,
                &[attr(0, 8, 0, 1), attr(1, 48, 0, 16)],
            )
            .map(|_| ()),
            libc::EFAULT,
            "unwritable response",
        ),
        (
            method(s.fd, DEVICE, QUERY_PORT, &[attr(0, 8, 0, 1)]).map(|_| ()),
            libc::EINVAL,
            "no response",
        ),
        (
            method(
                s.fd,
                DEVICE,
                QUERY_PORT,
                &[attr(0, 0, 0, 1), buf(1, 0, &mut resp)],
            )
            .map(|_| ()),
            libc::EINVAL,
            "empty port",
        ),
    ];
    for (got, errno, what) in bad {
        assert_eq!(got, Err(errno), "{what}");
    }
    assert_eq!(
        query_port(s.fd, 1, &mut resp, &[attr(0x77, 8, 0, 0)]),
        Ok(()),
        "unknown optional attribute skipped"
    );

    // QUERY_GID_ENTRY: RoCE v1 and v2 entries with the loopback device (the fake sysfs'
    // netdev); an empty entry ENODATA, past the table, on no port or with flags EINVAL.
    let gid = |port: u64, index: u64, flags: u64, e: &mut [u8]| {
        let attrs = [
            attr(0, 8, MANDATORY, port),
            attr(1, 8, MANDATORY, index),
            attr(2, 4, MANDATORY, flags),
            buf(3, MANDATORY, e),
        ];
        method(s.fd, DEVICE, QUERY_GID_ENTRY, &attrs).map(|_| ())
    };
    let field = |e: &[u8], at: usize| u32::from_ne_bytes(e[at..at + 4].try_into().unwrap());
    let mut e = [0u8; 32];
    assert_eq!(gid(1, 3, 0, &mut e), Ok(()));
    // SAFETY: if_nametoindex with a NUL-terminated name.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    assert_eq!(
        (field(&e, 16), field(&e, 20), field(&e, 24), field(&e, 28)),
        (3, 1, 2, lo),
        "index, port, RoCE v2, lo"
    );
    assert_eq!(&e[10..12], &[0xff, 0xff], "an IPv4-mapped GID");
    assert_eq!(gid(1, 0, 0, &mut e), Ok(()));
    assert_eq!(field(&e, 24), 1, "RoCE v1");
    assert_eq!(gid(1, 7, 0, &mut e), Err(libc::ENODATA));
    assert_eq!(gid(1, 16, 0, &mut e), Err(libc::EINVAL));
    assert_eq!(gid(2, 0, 0, &mut e), Err(libc::EINVAL));
    assert_eq!(gid(1, 0, 1, &mut e), Err(libc::EINVAL));
    assert_eq!(gid(1, 0, 0, &mut e[..16]), Err(libc::EINVAL));
    // QUERY_GID_TABLE: the 4 valid entries, in elements of the caller's size.
    let table = |size: u64, b: &mut [u8], n: &mut [u8; 8]| {
        let attrs = [
            attr(0, 8, MANDATORY, size),
            buf(2, MANDATORY, b),
            buf(3, MANDATORY, n),
        ];
        method(s.fd, DEVICE, QUERY_GID_TABLE, &attrs).map(|_| u64::from_ne_bytes(*n))
    };
    let (mut t, mut n) = ([0u8; 16 * 32], [0u8; 8]);
    assert_eq!(table(32, &mut t, &mut n), Ok(4));
    assert_eq!(field(&t, 3 * 32 + 24), 2, "entry 3 is RoCE v2");
    assert_eq!(table(16, &mut t[..64], &mut n), Ok(4), "GIDs only");
    assert_eq!(
        table(32, &mut t[..96], &mut n),
        Err(libc::EINVAL),
        "too small"
    );
    assert_eq!(table(0, &mut t, &mut n), Err(libc::EINVAL));
    assert_eq!(
        table(32, &mut t[..100], &mut n),
        Err(libc::EINVAL),
        "not whole elements"
    );

    // A PD (INVOKE_WRITE: ALLOC_PD has no native method), then a CQ natively.
    let r = (s.resp as u64).to_ne_bytes();
    let pd_cmd = [
        attr(CORE_IN, 8, MANDATORY, u64::from_ne_bytes(r)),
        attr(CORE_OUT, 8, 0, s.resp as u64),
        attr(WRITE_CMD, 8, MANDATORY, ALLOC_PD),
    ];
    assert_eq!(invoke(s.fd, &pd_cmd), Ok(()));
    // SAFETY: the response area holds ALLOC_PD's response (the handle first).
    let pd = unsafe { *(s.resp as *const u32) } as u64;
    let mut ring = vec![0u8; 64 * 64 + 4096];
    let ring_at = (ring.as_mut_ptr() as u64 + 4095) & !4095;
    let mut dbrec = [0u64; 1];
    // mlx5_ib_create_cq: buf_addr, db_addr, cqe_size (64), the rest zero.
    let mut mlx5 = [ring_at, dbrec.as_mut_ptr() as u64, 64, 0];
    let mut cqe = [0u8; 4];
    let cq_attrs = |extra: &[[u64; 2]], cqe: &mut [u8; 4], mlx5: &mut [u64; 4]| {
        let mut a = vec![
            attr(0, 0, MANDATORY, 0),
            attr(1, 4, MANDATORY, 63),
            attr(2, 8, MANDATORY, 0x1234),
            attr(4, 4, MANDATORY, 0),
            buf(6, MANDATORY, cqe),
            attr(UHW_IN, 32, MANDATORY, mlx5.as_mut_ptr() as u64),
        ];
        for e in extra {
            match a.iter_mut().find(|x| x[0] & 0xffff == e[0] & 0xffff) {
                Some(x) => *x = *e,
                None => a.push(*e),
            }
        }
        a
    };
    let refused = [
        (
            attr(1, 2, MANDATORY, 63),
            libc::EINVAL,
            "CQE shorter than a u32",
        ),
        (
            attr(1, 8, MANDATORY, 63 | 1 << 40),
            libc::EOPNOTSUPP,
            "CQE with non-zero bytes past its u32",
        ),
        (
            attr(5, 4, 0, 1),
            libc::EOPNOTSUPP,
            "flags (the extended command's)",
        ),
        (
            attr(3, 0, 0, 0),
            libc::EINVAL,
            "a completion channel (none is served)",
        ),
        (
            attr(7, 0, 0, 0),
            libc::EINVAL,
            "an event file not the context's",
        ),
        (
            attr(6, 4, MANDATORY, 16),
            libc::EFAULT,
            "unwritable CQE output",
        ),
        (
            attr(UHW_IN, 8, MANDATORY, 0),
            libc::EINVAL,
            "mlx5's request too short",
        ),
        (
            attr(UHW_IN, 32, MANDATORY, 16),
            libc::EFAULT,
            "mlx5's request unreadable",
        ),
        (
            attr(0x1077, 8, MANDATORY, 0),
            libc::EPROTONOSUPPORT,
            "unknown mandatory driver attribute",
        ),
    ];
    for (bad, errno, what) in refused {
        assert_eq!(
            method(s.fd, CQ, 0, &cq_attrs(&[bad], &mut cqe, &mut mlx5)).map(|_| ()),
            Err(errno),
            "{what}"
        );
    }
    let mut no_cqe = cq_attrs(&[], &mut cqe, &mut mlx5);
    no_cqe.remove(1);
    assert_eq!(
        method(s.fd, CQ, 0, &no_cqe),
        Err(libc::EINVAL),
        "no CQE count"
    );
    let made = method(s.fd, CQ, 0, &cq_attrs(&[], &mut cqe, &mut mlx5)).unwrap();
    let cq = made[0][1];
    assert_eq!(
        (
            u32::from_ne_bytes(cqe),
            native_command_count(Command::CreateCq).unwrap()
        ),
        (63, 1),
        "only the good one"
    );

    // QP_CREATE: what CREATE_QP cannot say, and bad handles, are refused before anything is made.
    let mut cap = [1u32, 1, 1, 1, 0];
    let mut qpn = [0u8; 4];
    let mut resp_cap = [0u8; 20];
    let (cap, qpn, resp_cap) = (
        cap.as_mut_ptr() as u64,
        qpn.as_mut_ptr() as u64,
        resp_cap.as_mut_ptr() as u64,
    );
    let qp_attrs = |extra: [u64; 2]| {
        vec![
            attr(0, 0, MANDATORY, 0),
            attr(2, 0, MANDATORY, pd),
            attr(4, 0, MANDATORY, cq),
            attr(5, 0, MANDATORY, cq),
            attr(7, 8, MANDATORY, 0x99),
            attr(8, 20, MANDATORY, cap),
            attr(9, 8, MANDATORY, 2),
            attr(13, 20, MANDATORY, resp_cap),
            attr(14, 4, MANDATORY, qpn),
            extra,
        ]
    };
    let refused = [
        (attr(2, 0, MANDATORY, 77), libc::EINVAL, "no such PD"),
        (
            attr(2, 0, MANDATORY, cq),
            libc::EINVAL,
            "a CQ's handle as the PD",
        ),
        (
            attr(2, 0, MANDATORY, 1 << 33),
            libc::EINVAL,
            "a handle wider than 32 bits",
        ),
        (attr(1, 0, 0, 1), libc::EOPNOTSUPP, "XRC"),
        (attr(6, 0, 0, 1), libc::EOPNOTSUPP, "RSS"),
        (attr(3, 0, 0, 1), libc::EINVAL, "an SRQ (none is served)"),
        (
            attr(10, 4, 0, 2),
            libc::EOPNOTSUPP,
            "create flags other than SQ_SIG_ALL",
        ),
        (attr(11, 4, 0, 5), libc::EOPNOTSUPP, "a source QPN"),
        (
            attr(8, 8, MANDATORY, 0),
            libc::EINVAL,
            "capabilities too short",
        ),
        (
            attr(14, 4, MANDATORY, 16),
            libc::EFAULT,
            "unwritable QP number",
        ),
    ];
    for (bad, errno, what) in refused {
        let mut a = qp_attrs(bad);
        if let Some(i) = a[..9].iter().position(|x| x[0] & 0xffff == bad[0] & 0xffff) {
            a[i] = a.pop().unwrap();
        }
        assert_eq!(method(s.fd, QP, 0, &a), Err(errno), "{what}");
    }
    assert_eq!(native_command_count(Command::CreateQp).unwrap(), 0);

    // Destroys: a response too short, a handle of another type, then the real ones (once).
    let mut gone = [0u8; 8];
    assert_eq!(
        method(
            s.fd,
            CQ,
            1,
            &[attr(0, 0, MANDATORY, cq), buf(1, MANDATORY, &mut gone[..4])]
        ),
        Err(libc::EINVAL)
    );
    assert_eq!(
        method(s.fd, MR, 1, &[attr(0, 0, MANDATORY, pd)]),
        Err(libc::EINVAL),
        "a PD is no MR"
    );
    assert_eq!(
        method(s.fd, CQ, 1, &[attr(0, 0, MANDATORY, cq)]),
        Err(libc::EINVAL),
        "no response"
    );
    assert_eq!(
        method(
            s.fd,
            CQ,
            1,
            &[attr(0, 0, MANDATORY, cq), buf(1, MANDATORY, &mut gone)]
        )
        .map(|_| ()),
        Ok(())
    );
    assert_eq!(
        method(
            s.fd,
            CQ,
            1,
            &[attr(0, 0, MANDATORY, cq), buf(1, MANDATORY, &mut gone)]
        ),
        Err(libc::EINVAL),
        "twice"
    );
    assert_eq!(
        method(s.fd, PD, 0, &[attr(0, 0, MANDATORY, pd)]).map(|_| ()),
        Ok(())
    );
    assert_eq!(
        method(s.fd, PD, 0, &[attr(0, 0, MANDATORY, pd)]),
        Err(libc::EINVAL)
    );
    assert_eq!(native_command_count(Command::DestroyCq).unwrap(), 1);
}

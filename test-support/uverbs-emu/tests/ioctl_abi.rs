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
use uverbs_emu::control::{ioctl_command_count, Command};
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
    // DEVICE/QUERY_CONTEXT, QUERY_GID_TABLE, QUERY_GID_ENTRY, mlx5's DEVX_OTHER (the DEVX
    // capability query). EPROTONOSUPPORT, not ENOTTY: the method is unknown, the interface is
    // there. The native methods served on the ioctl ABI (DEVICE/QUERY_PORT, GET_CONTEXT,
    // CQ_CREATE, QP_CREATE, PD_DESTROY) are unknown on the write ABI; on the ioctl ABI a
    // call without their mandatory attributes is EINVAL (GET_CONTEXT has none: it makes the
    // context).
    for (object, m) in [(0, 4), (0, 5), (0, 6), (0x1000, 0x1000)] {
        assert_eq!(
            method(s.fd, object, m, &[]),
            Err(libc::EPROTONOSUPPORT),
            "object {object:#x} method {m:#x}"
        );
    }
    let write_abi = std::env::var("UVEMU_ABI").as_deref() == Ok("write");
    for (object, m) in [(0, 2), (0, 3), (3, 0), (4, 0), (1, 0)] {
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

//! The emulated driver's ioctl ABI: write commands carried over `RDMA_VERBS_IOCTL`
//! (`DEVICE/INVOKE_WRITE`, the path libibverbs takes on a current kernel) are served and
//! counted as ioctl commands, and their attribute TLVs are validated as the kernel does:
//! unknown mandatory attributes EPROTONOSUPPORT, unknown optional ones skipped, duplicates,
//! reserved bits and missing attributes EINVAL, short responses ENOSPC, bad pointers EFAULT.
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

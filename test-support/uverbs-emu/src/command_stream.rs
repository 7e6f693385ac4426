//! A byte string read as a stream of commands to the emulated driver: what its fuzz target
//! (`fuzz/fuzz_targets/uverbs_commands.rs`) feeds it, and what the replay of that target's
//! corpus in this crate's tests runs, so that both read inputs the same way.
//!
//! Each command is `[flags: u8][len: u16 LE][len bytes]`; a short tail is the last command.
//! The flags help random bytes past the framing to the decoders behind it: bit 0 sets the
//! header's length to the command's own (legacy: 32-bit words), bit 1 points the response at
//! a writable area of the stream's own, bit 2 sends the bytes as `RDMA_VERBS_IOCTL` instead of
//! `write()` (the ioctl header's length set to theirs when bit 0 is set too). A stream starts
//! with a well-formed GET_CONTEXT unless its first byte is odd. Every command must come back
//! with a count or an errno; the driver must neither crash nor hang.

use std::ffi::{c_void, CStr};

/// `RDMA_VERBS_IOCTL`: `_IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)` (24 bytes).
const RDMA_VERBS_IOCTL: u64 = 0xc018_1b01;
/// `IB_USER_VERBS_CMD_GET_CONTEXT`.
const GET_CONTEXT: u32 = 0;
/// Bytes of the response area: more than any response a header can announce
/// ((65535 + 65535) 8-byte words), so that no length reaches other memory.
pub const RESP_AREA: usize = 2 << 20;
/// The largest ioctl the driver reads: its header and 64 attributes.
const IOCTL_MAX: usize = 24 + 64 * 16;
/// Most bytes of one command (the driver refuses more than 1 MiB anyway).
const MAX_COMMAND: usize = 64 * 1024;

/// What a stream came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Commands the driver served.
    pub served: u32,
    /// Commands it refused with an errno.
    pub refused: u32,
}

/// Runs `data` as a stream of commands on a fresh context of `device`
/// (`/dev/infiniband/uverbs0`), which is closed at the end (destroying what the stream
/// created). Needs a process running under the emulated driver. Panics where a command
/// comes back with neither a count nor an errno.
pub fn run(device: &CStr, data: &[u8]) -> std::io::Result<Outcome> {
    let s = Stream::open(device)?;
    let mut out = Outcome::default();
    if data.first().is_none_or(|b| b & 1 == 0) {
        let mut ctx = GET_CONTEXT.to_ne_bytes().to_vec();
        ctx.extend_from_slice(&4u16.to_ne_bytes()); // in_words: header + response pointer
        ctx.extend_from_slice(&64u16.to_ne_bytes()); // out_words
        ctx.extend_from_slice(&(s.resp as u64).to_ne_bytes());
        s.count(&mut out, s.write(&ctx));
    }
    let mut rest = data.get(1..).unwrap_or_default();
    while let Some((&flags, tail)) = rest.split_first() {
        let len = match tail {
            [a, b, ..] => u16::from_le_bytes([*a, *b]) as usize,
            _ => 0,
        };
        let body = tail.get(2..).unwrap_or_default();
        let len = len.min(body.len()).min(MAX_COMMAND);
        let mut cmd = body[..len].to_vec();
        rest = &body[len..];
        s.fix_up(flags, &mut cmd);
        let r = if flags & 4 != 0 {
            s.ioctl(&mut cmd)
        } else {
            s.write(&cmd)
        };
        s.count(&mut out, r);
    }
    Ok(out)
}

/// An open context of the emulated device and the response area its commands point to
/// ([`RESP_AREA`] bytes, mapped for it); both are released on drop.
pub struct Stream {
    /// The command file.
    pub fd: i32,
    /// Where responses go.
    pub resp: *mut u8,
}

impl Stream {
    /// Opens `device` (the emulated `/dev/infiniband/uverbsN`) and maps a response area.
    pub fn open(device: &CStr) -> std::io::Result<Stream> {
        // SAFETY: open with a NUL-terminated path; the emulator serves it.
        let fd = unsafe { libc::open(device.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new anonymous mapping, unmapped on drop.
        let resp = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RESP_AREA,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if resp == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            // SAFETY: the descriptor opened above, closed once.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(Stream {
            fd,
            resp: resp.cast(),
        })
    }

    /// Applies a command's flags (see the module's header).
    fn fix_up(&self, flags: u8, cmd: &mut [u8]) {
        let ioctl = flags & 4 != 0;
        if flags & 1 != 0 && cmd.len() >= 8 {
            if ioctl {
                // `ib_uverbs_ioctl_hdr.length` (u16 at 0).
                let n = (cmd.len().min(u16::MAX as usize) as u16).to_ne_bytes();
                cmd[..2].copy_from_slice(&n);
            } else {
                // `ib_uverbs_cmd_hdr.in_words` (u16 at 4), in 32-bit words.
                let n = ((cmd.len() / 4).min(u16::MAX as usize) as u16).to_ne_bytes();
                cmd[4..6].copy_from_slice(&n);
            }
        }
        if flags & 2 != 0 && !ioctl && cmd.len() >= 16 {
            // The response pointer: the core request's first word (legacy) or the extended
            // header's `response`, both at byte 8.
            cmd[8..16].copy_from_slice(&(self.resp as u64).to_ne_bytes());
        }
    }

    fn write(&self, cmd: &[u8]) -> isize {
        // SAFETY: a write of `cmd`'s bytes to the emulated device.
        unsafe { libc::write(self.fd, cmd.as_ptr().cast::<c_void>(), cmd.len()) }
    }

    fn ioctl(&self, cmd: &mut Vec<u8>) -> isize {
        // The driver reads a 24-byte header, then as many 16-byte attributes as it says (at
        // most 64): zeros after the command's bytes keep every read inside the buffer.
        if cmd.len() < IOCTL_MAX {
            cmd.resize(IOCTL_MAX, 0);
        }
        // SAFETY: the driver reads and writes back at most IOCTL_MAX bytes at the pointer,
        // all inside `cmd`.
        unsafe { libc::ioctl(self.fd, RDMA_VERBS_IOCTL as _, cmd.as_mut_ptr()) as isize }
    }

    /// Counts a command's result: a count is served, -1 with an errno refused.
    fn count(&self, out: &mut Outcome, r: isize) {
        if r >= 0 {
            out.served += 1;
        } else {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            assert!(e > 0, "a refused command without an errno");
            out.refused += 1;
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the descriptor and mapping open() made, released once.
        unsafe {
            libc::close(self.fd);
            libc::munmap(self.resp.cast(), RESP_AREA);
        }
    }
}

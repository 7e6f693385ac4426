//! mp's staged GPU payloads without a GPU: pinned host memory stands in for GPU memory
//! (`Comm::register_gpu_stand_in`), so sends and receives take the staged path (bounces of
//! the communicator's pool, copies by the CPU or by a host stream in the trigger's order).
//! Byte for byte at odd sizes and offsets, several receives outstanding, an error completion
//! in the middle, a message larger than the pool on an executor; CPU and host-stream
//! triggers. Messages larger than a bounce (chunks) and staged gets: the `chunked` module;
//! puts and gets in chunks, puts with signal and empty messages: the `one_sided` module.

use gdasync::gdsync::exec::HostStream;
use gdasync::gdsync::{GpuMemoryPath, PinnedBuffer};
use gdasync::mp::{Comm, GpuRegion};
use std::time::{Duration, Instant};

mod common;
use common::{on_threads, staged_stream_of_messages};

/// Messages larger than a bounce (in chunks), and staged gets.
#[path = "mp_staging/chunked.rs"]
mod chunked;

/// Puts and gets larger than a bounce (in chunks), puts with signal, empty messages.
#[path = "mp_staging/one_sided.rs"]
mod one_sided;

/// Bytes of each rank's stand-in region.
const REGION: usize = 32 << 10;

/// The byte at `i` of message `m`.
fn pattern(m: usize, i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (m * 7 + 1)) as u8
}

fn region(comm: &Comm, fill: u8) -> GpuRegion {
    let buf = PinnedBuffer::with_cuda(REGION, None);
    buf.write_at(0, &vec![fill; REGION]);
    let r = comm.register_gpu_stand_in(buf);
    assert_eq!(r.path(), GpuMemoryPath::Staged);
    r
}

/// The bytes of a stand-in region.
fn bytes(r: &GpuRegion) -> Vec<u8> {
    // SAFETY: the region's stand-in buffer is REGION bytes of host memory, alive with `r`.
    unsafe { std::slice::from_raw_parts(r.addr() as *const u8, REGION) }.to_vec()
}

/// Messages (size, offset) at odd sizes and offsets.
const CASES: [(usize, usize); 6] = [(1, 0), (3, 1), (17, 7), (4093, 13), (4097, 3), (9001, 5)];

/// Rank 0 sends CASES from its region at their offsets, rank 1 receives each at the same
/// offset; every case outstanding at once (each in its own bounce), checked byte for byte,
/// with the bytes around every slice untouched.
fn odd_sizes(comm: &mut Comm, on_stream: bool) {
    let peer = 1 - comm.rank();
    let stream = HostStream::new().unwrap();
    let fill = 0xEE;
    let reg = region(comm, fill);
    for (m, &(len, off)) in CASES.iter().enumerate() {
        let at = off + (m % 2) * 5000;
        let s = reg.slice(at..at + len);
        let r = if comm.rank() == 0 {
            let payload: Vec<u8> = (0..len).map(|i| pattern(m, i)).collect();
            write(&reg, at, &payload);
            match on_stream {
                true => comm.isend_gpu_on(s, peer, &stream),
                false => comm.isend_gpu(s, peer),
            }
        } else {
            match on_stream {
                true => comm.irecv_gpu_on(s, peer, &stream),
                false => comm.irecv_gpu(s, peer),
            }
        }
        .unwrap();
        if comm.rank() == 1 {
            if on_stream {
                comm.wait_on(r, &stream).unwrap();
            }
            stream.synchronize().unwrap();
            comm.wait(r).unwrap();
            let got = bytes(&reg);
            for i in 0..len {
                assert_eq!(
                    got[at + i],
                    pattern(m, i),
                    "case {m} ({len} B at {at}): byte {i}"
                );
            }
            if at > 0 {
                assert_eq!(got[at - 1], fill, "case {m}: the byte before was written");
            }
            assert_eq!(got[at + len], fill, "case {m}: the byte after was written");
            write(&reg, at, &vec![fill; len]);
        } else {
            if on_stream {
                stream.synchronize().unwrap();
            }
            comm.wait(r).unwrap();
        }
    }
    comm.barrier().unwrap();
}

fn write(reg: &GpuRegion, at: usize, src: &[u8]) {
    // SAFETY: `at..at + src.len()` lies in the region's stand-in buffer (REGION bytes).
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), (reg.addr() as *mut u8).add(at), src.len())
    };
}

/// A staged receive waited for on an executor is complete for the CPU (`test` returns it)
/// only once its bytes are in GPU memory: the executor copies them in before it retires the
/// completion the CPU learns of. Each of 20 messages of 30,000 bytes is tested for on the CPU
/// as fast as it can, and read the moment `test` returns it.
#[test]
fn a_staged_receive_waited_for_on_an_executor_is_complete_only_once_copied_in() {
    on_threads(2, |comm| {
        const LEN: usize = 30_000;
        let peer = 1 - comm.rank();
        comm.set_staging(LEN, 4, 4).unwrap();
        let stream = HostStream::new().unwrap();
        let reg = region(comm, 0);
        for m in 0..20 {
            if comm.rank() == 0 {
                let payload: Vec<u8> = (0..LEN).map(|i| pattern(m, i)).collect();
                write(&reg, 0, &payload);
                let s = comm.isend_gpu(reg.slice(0..LEN), peer).unwrap();
                comm.wait(s).unwrap();
            } else {
                let r = comm.irecv_gpu_on(reg.slice(0..LEN), peer, &stream).unwrap();
                comm.wait_on(r, &stream).unwrap();
                let until = Instant::now() + Duration::from_secs(10);
                while comm.test(r).unwrap().is_none() {
                    assert!(Instant::now() < until, "message {m} never completed");
                }
                let got = bytes(&reg);
                for (i, &b) in got[..LEN].iter().enumerate() {
                    assert_eq!(
                        b,
                        pattern(m, i),
                        "message {m}: byte {i} when test returned it"
                    );
                }
            }
            comm.barrier().unwrap();
        }
    });
}

#[test]
fn staged_odd_sizes_and_offsets_on_the_cpu() {
    on_threads(2, |c| odd_sizes(c, false));
}

#[test]
fn staged_odd_sizes_and_offsets_on_a_host_stream() {
    on_threads(2, |c| odd_sizes(c, true));
}

/// Rank 1 posts N receives at once, each into its own slice; rank 0 sends N distinct
/// messages; each lands in its own slice (a bounce per outstanding receive).
fn outstanding(comm: &mut Comm, on_stream: bool) {
    const N: usize = 12;
    const LEN: usize = 1000;
    let peer = 1 - comm.rank();
    let stream = HostStream::new().unwrap();
    let reg = region(comm, 0);
    let slot = |m: usize| m * (LEN + 3) + 1;
    let mut reqs = Vec::new();
    for m in 0..N {
        let s = reg.slice(slot(m)..slot(m) + LEN);
        let r = if comm.rank() == 1 {
            match on_stream {
                true => comm.irecv_gpu_on(s, peer, &stream),
                false => comm.irecv_gpu(s, peer),
            }
        } else {
            let payload: Vec<u8> = (0..LEN).map(|i| pattern(m, i)).collect();
            write(&reg, slot(m), &payload);
            comm.isend_gpu(s, peer)
        }
        .unwrap();
        reqs.push(r);
    }
    if comm.rank() == 1 && on_stream {
        comm.wait_all_on(&reqs, &stream).unwrap();
        stream.synchronize().unwrap();
    }
    let n = comm.wait_all(&reqs).unwrap();
    if comm.rank() == 1 {
        if !on_stream {
            assert_eq!(n, vec![LEN as u32; N]);
        }
        let got = bytes(&reg);
        for m in 0..N {
            for i in 0..LEN {
                assert_eq!(got[slot(m) + i], pattern(m, i), "message {m}: byte {i}");
            }
        }
    }
    comm.barrier().unwrap();
}

#[test]
fn staged_receives_outstanding_land_in_their_own_buffers_on_the_cpu() {
    on_threads(2, |c| outstanding(c, false));
}

#[test]
fn staged_receives_outstanding_land_in_their_own_buffers_on_a_host_stream() {
    on_threads(2, |c| outstanding(c, true));
}

/// Three staged messages; the middle receive is shorter than its message, so it completes
/// in error (and the connection with it): the waits are released (the stream's too, within
/// 2 s), the first message has landed (copied in after its wait), and the errors are
/// reported.
fn error_midway(comm: &mut Comm, on_stream: bool) {
    comm.set_timeout(Duration::from_secs(5));
    let peer = 1 - comm.rank();
    let stream = HostStream::new().unwrap();
    let reg = region(comm, 0);
    let lens = [64usize, 16, 64];
    let mut reqs = Vec::new();
    for (m, &len) in lens.iter().enumerate() {
        let at = m * 100 + 1;
        let r = if comm.rank() == 1 {
            let s = reg.slice(at..at + len);
            match on_stream {
                true => comm.irecv_gpu_on(s, peer, &stream),
                false => comm.irecv_gpu(s, peer),
            }
        } else {
            write(&reg, at, &[m as u8 + 1; 64]);
            comm.isend_gpu(reg.slice(at..at + 64), peer)
        }
        .unwrap();
        reqs.push(r);
    }
    let start = Instant::now();
    if comm.rank() == 1 && on_stream {
        comm.wait_all_on(&reqs, &stream).unwrap();
        stream.synchronize().unwrap();
    }
    let first = comm.wait(reqs[0]);
    let rest: Vec<_> = reqs[1..].iter().map(|&r| comm.wait(r)).collect();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "rank {}: the waits took {:?}",
        comm.rank(),
        start.elapsed()
    );
    // Requests an executor waited for learn the error of the poll that resolved them (the
    // CPU sees the stream's consumer index, not each completion): the first may say so too.
    if !(on_stream && comm.rank() == 1) {
        first.unwrap_or_else(|e| panic!("rank {}: the first message failed: {e}", comm.rank()));
    }
    assert!(
        rest[0].is_err(),
        "rank {}: the middle one succeeded",
        comm.rank()
    );
    println!("rank {}: {}", comm.rank(), rest[0].as_ref().unwrap_err());
    if comm.rank() == 1 {
        assert!(
            rest[1].is_err(),
            "the receive after the failed one succeeded"
        );
        assert_eq!(
            &bytes(&reg)[1..65],
            &[1u8; 64][..],
            "the first message did not land"
        );
    }
}

#[test]
fn staged_error_midway_releases_the_waits_on_the_cpu() {
    on_threads_failing(|c| error_midway(c, false));
}

#[test]
fn staged_error_midway_releases_the_waits_on_a_host_stream() {
    on_threads_failing(|c| error_midway(c, true));
}

/// Two thread ranks whose connection fails on purpose (no finalize: it would report it).
fn on_threads_failing(f: fn(&mut Comm)) {
    let dev = gdasync::gdsync::Device::soft().unwrap();
    let hs: Vec<_> = gdasync::mp::bootstrap::ThreadBootstrap::group(2)
        .into_iter()
        .map(|b| {
            let dev = dev.clone();
            std::thread::spawn(move || f(&mut Comm::new(Box::new(b), &dev).unwrap()))
        })
        .collect();
    for h in hs {
        h.join().expect("a rank failed");
    }
}

/// A message on an executor that needs more bounces than the pool has (8 chunks of 4 KiB,
/// 4 send bounces) is refused with a line that says what to do; after `set_staging` raises
/// the bounce, it goes (in one bounce).
#[test]
fn a_staged_message_larger_than_the_pool_is_refused_on_an_executor_until_the_bounce_is_raised() {
    on_threads(2, |comm| {
        let peer = 1 - comm.rank();
        let reg = region(comm, 7);
        comm.set_staging(4096, 4, 4).unwrap();
        let stream = HostStream::new().unwrap();
        let e = comm
            .isend_gpu_on(reg.slice(..), peer, &stream)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("needs 8 bounces of 4096 bytes") && e.contains("set_staging"),
            "{e}"
        );
        comm.set_staging(REGION, 4, 4).unwrap();
        let r = if comm.rank() == 0 {
            comm.isend_gpu(reg.slice(..), peer)
        } else {
            comm.irecv_gpu(reg.slice(..), peer)
        }
        .unwrap();
        if comm.rank() == 1 {
            let e = comm.set_staging(1, 1, 1).unwrap_err().to_string();
            assert!(e.contains("in use"), "a receive is outstanding: {e}");
        }
        assert_eq!(
            comm.wait(r).unwrap(),
            if comm.rank() == 1 { REGION as u32 } else { 0 }
        );
        comm.set_staging(1, 1, 1).unwrap();
    });
}

/// Many more messages than bounces (a pool of 2 each way), all on host streams: bounces come
/// back as sends complete and as the stream's copies in pass, and every message lands.
#[test]
fn staged_bounces_recycle_on_a_host_stream() {
    on_threads(2, |comm| {
        const N: usize = 40;
        const LEN: usize = 250;
        comm.set_staging(LEN, 2, 2).unwrap();
        let stream = HostStream::new().unwrap();
        let reg = region(comm, 0);
        let at = |m: usize| m * (LEN + 1);
        if comm.rank() == 0 {
            for m in 0..N {
                let payload: Vec<u8> = (0..LEN).map(|i| pattern(m, i)).collect();
                write(&reg, at(m), &payload);
            }
        }
        let reqs = staged_stream_of_messages(comm, &reg, N, LEN, &stream);
        stream.synchronize().unwrap();
        comm.wait_all(&reqs).unwrap();
        if comm.rank() == 1 {
            let got = bytes(&reg);
            for m in 0..N {
                for i in 0..LEN {
                    assert_eq!(got[at(m) + i], pattern(m, i), "message {m}: byte {i}");
                }
            }
        }
        comm.barrier().unwrap();
    });
}

/// CASES laid one after another, each at its odd offset past the end of the one before:
/// (size, start).
fn apart() -> Vec<(usize, usize)> {
    let mut end = 0;
    CASES
        .iter()
        .map(|&(len, off)| {
            let start = end + off + 1;
            end = start + len;
            (len, start)
        })
        .collect()
}

/// Puts from staged memory into a registered window: each rank puts odd-sized slices of its
/// stand-in region (at odd offsets) into its right neighbour's window, from the CPU and on a
/// host stream (copy out before the doorbell); every byte arrives.
fn staged_puts(comm: &mut Comm, on_stream: bool) {
    let (me, n) = (comm.rank(), comm.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let stream = HostStream::new().unwrap();
    let reg = region(comm, 0);
    let win_buf = PinnedBuffer::with_cuda(REGION, None);
    let wmr = comm
        .pd()
        .register_pinned(&win_buf, gdasync::gdsync::Access::ALL)
        .unwrap();
    let win = comm.window(&wmr).unwrap();
    let mut reqs = Vec::new();
    for (m, &(len, at)) in apart().iter().enumerate() {
        let payload: Vec<u8> = (0..len).map(|i| pattern(me * 8 + m, i)).collect();
        write(&reg, at, &payload);
        let s = reg.slice(at..at + len);
        // The same place in the window.
        reqs.push(
            match on_stream {
                true => comm.iput_gpu_on(s, &win, right, at as u64, &stream),
                false => comm.iput_gpu(s, &win, right, at as u64),
            }
            .unwrap(),
        );
    }
    if on_stream {
        stream.synchronize().unwrap();
    }
    comm.wait_all(&reqs).unwrap();
    comm.barrier().unwrap();
    let mut got = vec![0u8; REGION];
    win_buf.read_at(0, &mut got);
    for (m, &(len, at)) in apart().iter().enumerate() {
        for i in 0..len {
            assert_eq!(
                got[at + i],
                pattern(left * 8 + m, i),
                "rank {me}: put {m} byte {i}"
            );
        }
    }
    comm.barrier().unwrap();
}

#[test]
fn staged_puts_land_byte_for_byte_on_the_cpu_and_a_host_stream() {
    on_threads(2, |c| staged_puts(c, false));
    on_threads(3, |c| staged_puts(c, true));
}

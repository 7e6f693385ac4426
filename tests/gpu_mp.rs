//! The messaging layer on CUDA streams with GPU memory: every on-stream operation (send,
//! receive waits, put, get, put with signal, wait on a value, barrier) between 2 and 4 thread
//! ranks sharing one GPU and one soft device; and `pingpong --api mp --trigger kernel` (kernel
//! channels driven by persistent kernels) next to its `--api gdsync` floor; and (`staged`)
//! sends and receives of device buffers staged through mp's bounce pool. Each test is
//! ignored unless asked for (`cargo test --release --test gpu_mp -- --include-ignored`), and
//! then requires a GPU.

use gdasync::gdsync::cuda::{CudaStream, DeviceBuffer};
use gdasync::gdsync::ops::WaitCond;
use gdasync::gdsync::Access;
use gdasync::mp::Comm;

mod common;
use common::{example, gpu::gpu, json_field, on_threads};

/// Staged GPU buffers through mp's bounce pool.
#[path = "gpu_mp/staged.rs"]
mod staged;

const LEN: usize = 64 * 1024;
const MSGS: usize = 4;

fn pattern(from: usize, k: usize, i: usize) -> u8 {
    (from * 37 + k * 11 + i % 251) as u8
}

fn read(buf: &DeviceBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    buf.copy_to_host(off, &mut v).unwrap();
    v
}

/// One rank: all device buffers are allocated before any stream waits and freed after the
/// last barrier (freeing GPU memory synchronises the device, which would wait for streams
/// blocked on other ranks).
fn rank(comm: &mut Comm) {
    let (me, n) = (comm.rank(), comm.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let stream = CudaStream::new(0).unwrap();
    let sbuf = DeviceBuffer::alloc(0, MSGS * LEN).unwrap();
    let rbuf = DeviceBuffer::alloc(0, MSGS * LEN).unwrap();
    let wbuf = DeviceBuffer::alloc(0, 2 * LEN + 64).unwrap();
    let mut host = vec![0u8; MSGS * LEN];
    for (j, x) in host.iter_mut().enumerate() {
        *x = pattern(me, j / LEN, j % LEN);
    }
    sbuf.copy_from_host(0, &host).unwrap();
    wbuf.copy_from_host(0, &vec![0u8; 2 * LEN + 64]).unwrap();
    let smr = comm.pd().register_device(&sbuf, Access::ALL).unwrap();
    let rmr = comm.pd().register_device(&rbuf, Access::ALL).unwrap();
    let wmr = comm.pd().register_device(&wbuf, Access::ALL).unwrap();
    let win = comm.window(&wmr).unwrap();

    // Send/receive on the stream: receives posted by the CPU, sends and every wait on the
    // stream (isend_on + wait_all_on, and send_on).
    let recvs: Vec<_> = (0..MSGS)
        .map(|k| comm.irecv(rmr.sge(k * LEN..(k + 1) * LEN), left).unwrap())
        .collect();
    let mut sends: Vec<_> = (0..MSGS - 1)
        .map(|k| {
            comm.isend_on(smr.sge(k * LEN..(k + 1) * LEN), right, &stream)
                .unwrap()
        })
        .collect();
    comm.wait_all_on(&sends, &stream).unwrap();
    let last = MSGS - 1;
    sends.push(
        comm.send_on(smr.sge(last * LEN..MSGS * LEN), right, &stream)
            .unwrap(),
    );
    comm.wait_all_on(&recvs, &stream).unwrap();
    stream.synchronize().unwrap();
    comm.wait_all(&sends).unwrap();
    comm.wait_all(&recvs).unwrap();
    let got = read(&rbuf, 0, MSGS * LEN);
    for k in 0..MSGS {
        for i in (0..LEN).step_by(509) {
            assert_eq!(
                got[k * LEN + i],
                pattern(left, k, i),
                "rank {me}: message {k} byte {i} from {left}"
            );
        }
    }

    // Barrier on the stream, then put and get on the stream.
    comm.barrier_on(&stream).unwrap();
    let p = comm
        .iput_on(smr.sge(0..LEN), &win, right, 0, &stream)
        .unwrap();
    comm.wait_on(p, &stream).unwrap();
    comm.barrier_on(&stream).unwrap();
    stream.synchronize().unwrap();
    comm.wait(p).unwrap();
    let w = read(&wbuf, 0, LEN);
    assert!(
        (0..LEN).step_by(331).all(|i| w[i] == pattern(left, 0, i)),
        "rank {me}: put on a stream"
    );
    let g = comm
        .iget_on(rmr.sge(0..LEN), &win, left, 0, &stream)
        .unwrap();
    comm.wait_on(g, &stream).unwrap();
    stream.synchronize().unwrap();
    comm.wait(g).unwrap();
    let got = read(&rbuf, 0, LEN);
    let two_left = (left + n - 1) % n;
    assert!(
        (0..LEN)
            .step_by(331)
            .all(|i| got[i] == pattern(two_left, 0, i)),
        "rank {me}: get on a stream reads the left rank's window"
    );
    comm.barrier().unwrap();

    // Put with signal: the right rank's stream waits for the signal word (in GPU memory),
    // then the data must be there.
    let mut sig = [0u8; 8];
    sig[0] = 1;
    rbuf.copy_from_host(MSGS * LEN - 8, &sig).unwrap();
    let ps = comm
        .iput_signal_on(
            smr.sge(LEN..2 * LEN),
            &win,
            right,
            LEN as u64,
            rmr.sge(MSGS * LEN - 8..MSGS * LEN),
            (2 * LEN) as u64,
            &stream,
        )
        .unwrap();
    comm.wait_on(ps, &stream).unwrap();
    // SAFETY: wbuf lives until after the stream is synchronised below.
    unsafe {
        comm.wait_value_on(&wmr, 2 * LEN, 1, WaitCond::Geq, &stream)
            .unwrap()
    };
    stream.synchronize().unwrap();
    comm.wait(ps).unwrap();
    let w = read(&wbuf, LEN, LEN);
    assert!(
        (0..LEN).step_by(127).all(|i| w[i] == pattern(left, 1, i)),
        "rank {me}: data before its signal"
    );
    comm.barrier().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_mp -- --include-ignored"]
fn mp_on_streams_with_device_memory() {
    let _gpu = gpu();
    on_threads(2, rank);
    on_threads(4, rank);
}

/// `pingpong --op send --trigger kernel` through the messaging layer (`--api mp`: each rank's
/// persistent kernel drives its kernel channel, crediting receives 16 at a time, and once one
/// at a time; `--op write`: its puts into the peer's window, `gds_peer_put_flags`) and on the
/// QPs directly (`--api gdsync`, its floor), host and device memory (on
/// the soft device staged by default: `mp_pp_staged` through a staged kernel channel,
/// `pp_staged` through gdsync's bounces), a few sizes: every run succeeds and reports, per
/// size, the iterations asked for and positive, ordered latencies.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --test gpu_mp -- --include-ignored"]
fn pingpong_kernel_trigger_through_mp_and_gdsync() {
    let _gpu = gpu();
    let sizes = [8usize, 64, 4096];
    let list = sizes.map(|s| s.to_string()).join(",");
    let runs = [
        ("mp", "send", "host", "16"),
        ("mp", "send", "device", "16"),
        ("mp", "send", "host", "1"),
        ("mp", "write", "host", "16"),
        ("gdsync", "send", "host", "16"),
        ("gdsync", "send", "device", "16"),
    ];
    for (api, op, mem, recv_batch) in runs {
        // --recv-batch applies to the messaging layer only.
        let batch: &[&str] = if api == "mp" {
            &["--recv-batch", recv_batch]
        } else {
            &[]
        };
        let args = [
            "--api",
            api,
            "--op",
            op,
            "--trigger",
            "kernel",
            "--mem",
            mem,
            "--sizes",
            &list,
            "--iters",
            "300",
            "--warmup",
            "50",
            "--json",
        ];
        let args = [batch, &args[..]].concat();
        let (ok, out, err) = example::run("pingpong", &args);
        assert!(ok, "pingpong {args:?} failed:\n{out}\n{err}");
        let lines: Vec<&str> = out.lines().filter(|l| l.starts_with('{')).collect();
        assert_eq!(lines.len(), sizes.len(), "one line per size: {out}");
        for (line, size) in lines.iter().zip(sizes) {
            let num = |k: &str| -> f64 {
                json_field(line, k)
                    .parse()
                    .unwrap_or_else(|e| panic!("{k} in {line}: {e}"))
            };
            assert_eq!(json_field(line, "trigger"), "kernel", "{line}");
            assert_eq!(json_field(line, "mem"), mem, "{line}");
            assert_eq!(num("bytes"), size as f64, "{line}");
            assert_eq!(num("iters"), 300.0, "{line}");
            let (min, p50, p99) = (num("t_min_us"), num("t_p50_us"), num("t_p99_us"));
            assert!(
                min > 0.0 && min <= p50 && p50 <= p99 && p99.is_finite(),
                "--api {api} --op {op} --mem {mem} --recv-batch {recv_batch}: {line}"
            );
        }
        eprintln!(
            "pingpong --api {api} --op {op} --trigger kernel --mem {mem} --recv-batch {recv_batch}:\n{out}"
        );
    }
}

//! A ping-pong through the messaging layer (`mp`): two ranks (threads of this process here;
//! processes over TCP or MPI ranks alike), a communicator between them, and messages sent and
//! received with credits, so a send never meets an empty receive queue.
//!
//! ```text
//! cargo run --release --example mp_pingpong
//! ```

use gdasync::gdsync::{Device, Result};
use gdasync::mp::{bootstrap::ThreadBootstrap, Comm};
use std::time::Instant;

const ROUNDS: usize = 1000;
const LEN: usize = 64;

fn main() -> Result<()> {
    let dev = Device::soft()?; // one soft device serving both ranks
    let ranks: Vec<_> = ThreadBootstrap::group(2)
        .into_iter()
        .map(|boot| {
            let dev = dev.clone();
            std::thread::spawn(move || rank(Comm::new(Box::new(boot), &dev)?))
        })
        .collect();
    for r in ranks {
        r.join().expect("a rank panicked")?;
    }
    Ok(())
}

/// Rank 0 sends and waits for the echo; rank 1 echoes what it receives.
fn rank(mut comm: Comm) -> Result<()> {
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let mut buf = vec![0u8; 2 * LEN];
    let mr = comm.register(&mut buf)?;
    let (out, inbox) = (mr.sge(..LEN), mr.sge(LEN..));
    let start = Instant::now();
    for i in 0..ROUNDS {
        if me == 0 {
            mr.write_at(0, &[i as u8; LEN]);
            let echo = comm.irecv(inbox, peer)?; // post the receive before the send
            let sent = comm.isend(out, peer)?;
            comm.wait(sent)?;
            let len = comm.wait(echo)?;
            let mut got = [0u8; 1];
            mr.read_at(LEN, &mut got);
            assert_eq!((len as usize, got[0]), (LEN, i as u8), "round {i}");
        } else {
            let ping = comm.irecv(inbox, peer)?;
            comm.wait(ping)?;
            let mut got = [0u8; LEN];
            mr.read_at(LEN, &mut got);
            mr.write_at(0, &got);
            let echo = comm.isend(out, peer)?;
            comm.wait(echo)?;
        }
    }
    comm.barrier()?;
    if me == 0 {
        let half_rtt = start.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64 / 2.0;
        println!("mp ping-pong: {ROUNDS} round trips of {LEN} bytes between 2 ranks (threads, CPU), {half_rtt:.2} us half round trip");
    }
    comm.finalize()
}

//! The communicator logs its set-up (bootstrap, rank and size, each peer's QPs) and the loss
//! of a peer, naming the rank, through `tracing`.

#[path = "../../gdsync/tests/support/capture.rs"]
mod capture;

use capture::Capture;
use gdsync::Device;
use mp::bootstrap::ThreadBootstrap;
use mp::Comm;
use std::time::Duration;
use tracing::Level;

#[test]
fn set_up_and_peer_loss_are_logged() {
    let log = Capture::default();
    let mut boots = ThreadBootstrap::group(2);
    let b1 = boots.pop().unwrap();
    let b0 = boots.pop().unwrap();
    let d1 = log.dispatch();
    // Rank 1 sets up, then leaves without finalize: its device goes with it.
    let rank1 = std::thread::spawn(move || {
        tracing::dispatcher::with_default(&d1, || {
            let dev = Device::soft().unwrap();
            drop(Comm::new(Box::new(b1), &dev).unwrap());
        })
    });
    tracing::dispatcher::with_default(&log.dispatch(), || {
        let dev = Device::soft().unwrap();
        let mut comm = Comm::new(Box::new(b0), &dev).unwrap();
        rank1.join().unwrap();
        for rank in 0..2 {
            let ready = log.one(&[&format!("rank {rank} of 2: communicator ready")]);
            assert_eq!(ready.level, Level::INFO);
            assert!(ready.text.contains("connected to 1 peer in"), "{ready:?}");
            assert!(ready.text.contains("threads of this process"), "{ready:?}");
            let connected = log.one(&[&format!("rank {rank}: connected to rank {}", 1 - rank)]);
            assert_eq!(connected.level, Level::DEBUG);
            assert!(
                connected.text.contains("traffic QP") && connected.text.contains("credit QP"),
                "{connected:?}"
            );
        }
        comm.set_timeout(Duration::from_secs(20));
        let mut buf = vec![0u8; 64];
        let mr = comm.register(&mut buf).unwrap();
        let r = comm.isend(mr.sge(..), 1).unwrap();
        assert!(comm.wait(r).is_err(), "a send to a rank that left fails");
        let lost = log.one(&["rank 0: the connection to rank 1 failed"]);
        assert_eq!(lost.level, Level::WARN);
    });
}

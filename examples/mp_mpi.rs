//! The messaging layer over the MPI bootstrap (feature `mpi`): every rank exchanges messages
//! with its neighbours in a ring, puts into a window and meets at barriers; prints one line.
//!
//! ```text
//! cargo build --release -p gdasync-examples --features mpi --bin mp_mpi
//! mpirun -np 2 target/release/mp_mpi
//! ```

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::ToolArgs;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "mp_mpi",
    version,
    about = "The messaging layer over the MPI bootstrap: a ring exchange, a put and barriers (run under mpirun; needs the mpi feature)"
)]
struct Args {
    #[command(flatten)]
    tool: ToolArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    args.tool.run(ring)
}

#[cfg(feature = "mpi")]
fn ring() -> anyhow::Result<()> {
    use common::out::outln;
    use gdasync::gdsync::Device;
    use gdasync::mp::bootstrap::MpiBootstrap;
    use gdasync::mp::{mpi_crate as mpi, Comm};
    let universe =
        mpi::initialize().ok_or_else(|| anyhow::anyhow!("MPI is already initialised"))?;
    let mut comm = Comm::new(Box::new(MpiBootstrap::new(&universe)), &Device::soft()?)?;
    let (me, n) = (comm.rank(), comm.size());
    anyhow::ensure!(n >= 2, "run with at least 2 ranks (mpirun -np 2)");
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let mut sbuf = vec![me as u8 + 1; 4096];
    let mut rbuf = vec![0u8; 4096];
    let mut wbuf = vec![0u8; 4096];
    let smr = comm.register(&mut sbuf)?;
    let rmr = comm.register(&mut rbuf)?;
    let wmr = comm.register(&mut wbuf)?;
    let s = comm.isend(smr.sge(..), right)?;
    let r = comm.irecv(rmr.sge(..), left)?;
    comm.wait_all(&[s, r])?;
    let win = comm.window(&wmr)?;
    let p = comm.iput(smr.sge(..8), &win, right, 0)?;
    comm.wait(p)?;
    comm.barrier()?;
    let (mut got, mut put) = ([0u8; 1], [0u8; 1]);
    rmr.read_at(4095, &mut got);
    wmr.read_at(0, &mut put);
    anyhow::ensure!(
        got[0] == left as u8 + 1 && put[0] == left as u8 + 1,
        "rank {me}: got {} / {}",
        got[0],
        put[0]
    );
    outln!("rank {me} of {n}: ok (MPI bootstrap)");
    comm.finalize()?;
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn ring() -> anyhow::Result<()> {
    anyhow::bail!(
        "built without the mpi feature: cargo build --release -p gdasync-examples --features mpi --bin mp_mpi, then mpirun -np 2 target/release/mp_mpi"
    )
}

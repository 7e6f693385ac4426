//! Probes whether a kernel's first launch in a context runs while another stream of the
//! context waits (a stream memory wait that the host releases only after 3 s), for kernels
//! with and without local memory; prints one line. One probe per process (first launches
//! happen once per context). Also prints the stencil and pingpong kernels' local memory.
//!
//! ```text
//! cargo run --release --bin launch_probe -- plain|local-small|local-big|stencil|pingpong
//! ```

#[path = "common/mod.rs"]
mod common;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use common::out::outln;
use common::ToolArgs;
use gdasync::gdsync::cuda::{Cuda, CudaStream, Function, Module};
use gdasync::gdsync::exec::Executor;
use gdasync::gdsync::ops::WaitCond;
use gdasync::gdsync::SignalWords;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// What to probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// A kernel without local memory.
    Plain,
    /// A kernel with 256 bytes of local memory per thread.
    LocalSmall,
    /// A kernel with 16 KiB of local memory per thread.
    LocalBig,
    /// Print the local memory of the stencil2d kernels (no probe).
    Stencil,
    /// Print the local memory of pingpong's kernels (no probe).
    Pingpong,
}

#[derive(Parser)]
#[command(
    name = "launch_probe",
    version,
    about = "Whether a kernel's first launch runs while another stream of the context waits (needs a CUDA GPU)"
)]
struct Args {
    /// What to probe.
    #[arg(value_enum, default_value = "plain")]
    mode: Mode,
    #[command(flatten)]
    tool: ToolArgs,
}

const KERNELS: &str = r#"
extern "C" __global__ void plain(unsigned int* p, int k) { *p = 1; }
extern "C" __global__ void local_small(unsigned int* p, int k) {
    volatile unsigned int a[64];
    for (int i = 0; i < 64; i++) a[i] = i;
    *p = a[k & 63] == (unsigned)(k & 63) ? 1 : 2;
}
extern "C" __global__ void local_big(unsigned int* p, int k) {
    volatile unsigned int a[4096];
    for (int i = 0; i < 4096; i++) a[i] = i;
    *p = a[k & 4095] == (unsigned)(k & 4095) ? 1 : 2;
}
"#;

fn main() -> ExitCode {
    let args = Args::parse();
    args.tool.run(|| probe(args.mode))
}

/// The local memory of pingpong's kernels.
fn pingpong_locals() -> Result<()> {
    let m = Module::compile(0, include_str!("pingpong/kernels.cu"))?;
    let names = [
        "pp",
        "pp_staged",
        "pp_read",
        "mp_pp",
        "mp_pp_put",
        "mp_pp_get",
        "mp_pp_staged",
    ];
    print_locals("pingpong", &m, &names)
}

/// The local memory of the stencil2d kernels.
fn stencil_locals() -> Result<()> {
    let src = include_str!("stencil2d/kernels.cu");
    let m = Module::compile_with_options(0, src, &["--fmad=false"])?;
    print_locals(
        "stencil",
        &m,
        &["pack", "interior", "ring", "whole", "persistent"],
    )
}

/// One line per kernel of `m`: its local memory per thread.
fn print_locals(what: &str, m: &Module, names: &[&str]) -> Result<()> {
    for name in names {
        outln!(
            "{what} kernel {name}: {} local bytes per thread",
            m.function(name)?.local_bytes()?
        );
    }
    Ok(())
}

fn probe(mode: Mode) -> Result<()> {
    Cuda::get()
        .and_then(|c| c.gpu(0).map(|_| ()))
        .context("launch_probe needs a CUDA GPU")?;
    let name = match mode {
        Mode::Plain => "plain",
        Mode::LocalSmall => "local_small",
        Mode::LocalBig => "local_big",
        Mode::Stencil => return stencil_locals(),
        Mode::Pingpong => return pingpong_locals(),
    };
    let mode = common::name(mode);
    let m = Module::compile(0, KERNELS)?;
    let f: Function = m.function(name)?;
    let local = f.local_bytes()?;
    let (a, b) = (CudaStream::new(0)?, CudaStream::new(0)?);
    let w = SignalWords::new(3);
    a.submit(w.wait32(0, 1, WaitCond::Eq))?;
    let start = Instant::now();
    let returned = std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let (p, k) = (w.addr(1), 1i32);
            // SAFETY: (pointer to a pinned word that outlives the kernel, int) as declared.
            let r = unsafe { f.launch_builder(&b).arg(&p).arg(&k).launch(1, 1) };
            w.store32(2, 1);
            r
        });
        while w.load32(1) == 0 && start.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let returned = w.load32(2) == 1;
        let ran = w.load32(1);
        outln!(
            "probe {mode}: {local} local bytes; launch call returned before the release: {returned}; kernel ran while the other stream waited: {} ({:?})",
            ran != 0,
            start.elapsed()
        );
        w.store32(0, 1);
        h.join().expect("launch thread")
    });
    returned?;
    a.synchronize()?;
    b.synchronize()?;
    outln!("probe {mode}: done after release, word {}", w.load32(1));
    Ok(())
}

//! The value types the examples share, so that a flag means the same in every tool:
//! `--trigger`, `--mem`, `--staging`, `--ranks-as`.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::ValueEnum;

/// Who drives the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Trigger {
    /// The CPU posts and polls (no GPU needed).
    Cpu,
    /// GPU work in the loop, the CPU drives the NIC: synchronise, post, poll (the MPI-style
    /// baseline).
    Host,
    /// Stream-triggered: a CUDA stream rings the doorbells and waits for the completions.
    Stream,
    /// Kernel-initiated: a persistent CUDA kernel posts and waits by itself.
    Kernel,
}

impl Trigger {
    /// Whether this trigger needs a CUDA GPU.
    pub fn gpu(self) -> bool {
        self != Trigger::Cpu
    }
}

/// Where message buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mem {
    /// Host memory (pinned where a GPU needs to reach it).
    Host,
    /// GPU memory (needs a CUDA GPU).
    Device,
}

/// `--staging`: how payloads in GPU memory reach the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Staging {
    /// Staged where the device cannot DMA GPU memory (the soft device; an mlx5 device with
    /// neither dma-buf nor a peer-memory module), else direct; GDSYNC_STAGING decides if set.
    Auto,
    /// Through pinned host bounce buffers, copied in the trigger's own order.
    On,
    /// The device reads and writes GPU memory itself (GPUDirect RDMA; the soft device copies
    /// each payload synchronously from its engine thread).
    Off,
}

impl Staging {
    /// The path asked for (`None`: automatic).
    pub fn asked(self) -> Option<gdasync::gdsync::GpuMemoryPath> {
        use gdasync::gdsync::GpuMemoryPath as P;
        match self {
            Staging::Auto => None,
            Staging::On => Some(P::Staged),
            Staging::Off => Some(P::Direct),
        }
    }
}

/// How the ranks of a run are started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RanksAs {
    /// Threads of this process.
    Threads,
    /// Processes on this host, started by this one (TCP bootstrap, shared-memory links).
    Procs,
    /// The processes of an MPI job (`mpirun -np R`; needs the `mpi` feature).
    Mpi,
}

/// The command-line spelling of a value (`cpu`, `host`, `threads`).
pub fn name<T: ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// A parser for `T` that accepts only `allowed` (and lists only those in `--help`), for a
/// tool that implements part of a shared vocabulary.
pub fn one_of<T>(allowed: &'static [T]) -> impl TypedValueParser<Value = T>
where
    T: ValueEnum + Clone + Send + Sync + 'static,
{
    PossibleValuesParser::new(allowed.iter().filter_map(ValueEnum::to_possible_value)).map(
        move |s| {
            allowed
                .iter()
                .find(|v| name((*v).clone()) == s)
                .cloned()
                .expect("the parser admits only the allowed values")
        },
    )
}

//! `--gpus`: which GPUs a tool's ranks run on, the same flag in every tool. Ranks are placed
//! round robin over the list (every GPU of the machine by default): rank `r` on the
//! `(r mod n)`-th GPU listed, where `r` is the rank's **local** rank, its place among the
//! ranks of its host. Threads and `--ranks-as procs` run on one host, so there the local rank
//! is the rank; under MPI the launcher says it ([`LOCAL_RANK_VARS`]). The placement is
//! resolved once, before anything is printed, and reported in the header and the JSON rows
//! (`gpus`: the GPU of each rank, in rank order).

use anyhow::{bail, Context, Result};
use std::sync::OnceLock;

/// Most GPUs a list may name (more than any host has).
pub const MAX_GPUS: usize = 64;

/// Where launchers put a process's local rank: Open MPI, MPICH and Intel MPI (Hydra),
/// MVAPICH, PMIx, Slurm, Cray PALS, Flux. The first one set wins.
pub const LOCAL_RANK_VARS: [&str; 7] = [
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PMIX_LOCAL_RANK",
    "SLURM_LOCALID",
    "PALS_LOCAL_RANKID",
    "FLUX_TASK_LOCAL_ID",
];

/// The GPU flag.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct GpuArgs {
    /// GPUs the ranks run on, round robin by local rank (`0,1`: rank 0 on GPU 0, rank 1 on
    /// GPU 1, rank 2 on GPU 0, ...; `0`: every rank on GPU 0). Default: every GPU of the
    /// machine. Under MPI the local rank comes from the launcher (OMPI_COMM_WORLD_LOCAL_RANK
    /// and the like).
    #[arg(long, value_name = "LIST", value_parser = parse_list)]
    pub gpus: Option<GpuList>,
}

/// GPU ordinals, as `--gpus` lists them (distinct, at least one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuList(pub Vec<i32>);

/// Parses `0,1,3`.
pub fn parse_list(s: &str) -> std::result::Result<GpuList, String> {
    let mut out: Vec<i32> = Vec::new();
    for part in s.split(',') {
        let p = part.trim();
        let g: u16 = p
            .parse()
            .map_err(|_| format!("{p:?} is not a GPU number: list GPU ordinals, such as 0,1"))?;
        let g = i32::from(g);
        if out.contains(&g) {
            return Err(format!("GPU {g} is listed twice"));
        }
        if out.len() == MAX_GPUS {
            return Err(format!("at most {MAX_GPUS} GPUs"));
        }
        out.push(g);
    }
    Ok(GpuList(out))
}

/// Where each rank runs: the GPUs, in the order ranks take them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    gpus: Vec<i32>,
    /// This process's local rank and where it came from, where a launcher said it (MPI).
    local: Option<(usize, &'static str)>,
}

impl GpuArgs {
    /// The placement over `count` GPUs (the machine's): every GPU listed must exist. An error
    /// names the GPUs there are.
    pub fn resolve(&self, count: usize) -> Result<Placement> {
        let gpus = match &self.gpus {
            None if count == 0 => bail!("no CUDA GPU here"),
            None => (0..count as i32).collect(),
            Some(GpuList(l)) => l.clone(),
        };
        if let Some(g) = gpus.iter().find(|&&g| g as usize >= count) {
            let here = match count {
                0 => "none".to_string(),
                1 => "GPU 0".to_string(),
                n => format!("GPUs 0 to {}", n - 1),
            };
            bail!("--gpus: no GPU {g} on this machine ({here})");
        }
        Ok(Placement { gpus, local: None })
    }

    /// [`resolve`](Self::resolve) over this machine's GPUs.
    pub fn resolve_here(&self) -> Result<Placement> {
        let c = gdasync::gdsync::cuda::Cuda::get()?;
        self.resolve(c.gpus.len())
    }

    /// Refuses `--gpus` for a run that uses no GPU (`why` says what would).
    pub fn refuse_unless(&self, gpu_used: bool, why: &str) -> Result<()> {
        if self.gpus.is_some() && !gpu_used {
            bail!("--gpus applies to runs that use a GPU ({why})");
        }
        Ok(())
    }
}

impl Placement {
    /// Every rank on GPU 0 (tools and tests that place nothing).
    pub fn gpu0() -> Placement {
        Placement {
            gpus: vec![0],
            local: None,
        }
    }

    /// Takes the local rank from the launcher's environment ([`LOCAL_RANK_VARS`]), for the
    /// ranks of an MPI job (which may span hosts: the global rank says nothing of the GPUs).
    pub fn under_mpi(mut self) -> Placement {
        self.local = local_rank();
        self
    }

    /// The GPU of rank `rank` (its local rank under MPI).
    pub fn ordinal(&self, rank: usize) -> i32 {
        let local = self.local.map_or(rank, |(l, _)| l);
        self.gpus[local % self.gpus.len()]
    }

    /// How many of `ranks` ranks run on the GPU of `rank` (ranks of one host).
    pub fn sharing(&self, rank: usize, ranks: usize) -> usize {
        let mine = self.ordinal(rank);
        match self.local {
            Some(_) => ranks.div_ceil(self.gpus.len()),
            None => (0..ranks).filter(|&r| self.ordinal(r) == mine).count(),
        }
    }

    /// How many GPUs of this host the job's `ranks` ranks use: under MPI as many of the list as
    /// this host's ranks fill (each on its local rank's GPU; the launcher's local size where it
    /// gives one, else every rank counted as local), else those [`ordinal`](Self::ordinal)
    /// names.
    pub fn job_gpus(&self, ranks: usize) -> usize {
        match self.local {
            Some(_) => self.gpus.len().min(local_size().unwrap_or(ranks)),
            None => self.used(0..ranks).len(),
        }
    }

    /// Tells gdsync whether the job's `ranks` ranks run streams on more than one GPU of this
    /// host, other processes' included: its list-kernel choice depends on it
    /// (`gdsync::cuda::set_job_spans_gpus`). Before the first stream.
    pub fn tell_gdsync(&self, ranks: usize) {
        gdasync::gdsync::cuda::set_job_spans_gpus(self.job_gpus(ranks) > 1);
    }

    /// The GPUs this process's ranks `ranks` use, each once.
    pub fn used(&self, ranks: impl IntoIterator<Item = usize>) -> Vec<i32> {
        let mut v: Vec<i32> = ranks.into_iter().map(|r| self.ordinal(r)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// For the header and JSON: the GPU of each of `ranks` ranks (`0,1,0,1`); under MPI the
    /// rule (`local rank over 0,1 (OMPI_COMM_WORLD_LOCAL_RANK)`).
    pub fn label(&self, ranks: usize) -> String {
        let list = |v: &mut dyn Iterator<Item = i32>| {
            v.map(|g| g.to_string()).collect::<Vec<_>>().join(",")
        };
        match self.local {
            Some((_, var)) => format!(
                "local rank over {} ({var})",
                list(&mut self.gpus.iter().copied())
            ),
            None => list(&mut (0..ranks).map(|r| self.ordinal(r))),
        }
    }
}

/// Where launchers put the number of a job's ranks on this host: Open MPI, MPICH and Intel MPI
/// (Hydra), MVAPICH, PMIx.
const LOCAL_SIZE_VARS: [&str; 4] = [
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "MV2_COMM_WORLD_LOCAL_SIZE",
    "PMIX_LOCAL_SIZE",
];

/// The number of the job's ranks on this host, from the first of [`LOCAL_SIZE_VARS`] that holds
/// a number.
fn local_size() -> Option<usize> {
    LOCAL_SIZE_VARS
        .iter()
        .find_map(|&v| std::env::var(v).ok()?.trim().parse().ok())
}

/// This process's local rank, from the first of [`LOCAL_RANK_VARS`] that holds a number.
pub fn local_rank() -> Option<(usize, &'static str)> {
    LOCAL_RANK_VARS.iter().find_map(|&v| {
        let n = std::env::var(v).ok()?.trim().parse().ok()?;
        Some((n, v))
    })
}

/// The placement of this process's ranks, for code far from the command line (set once by
/// the tool's `main`; GPU 0 for every rank where it was not).
static PLACED: OnceLock<Placement> = OnceLock::new();

/// Sets the process's placement ([`of`]); a second call keeps the first.
pub fn place(p: Placement) {
    let _ = PLACED.set(p);
}

/// The GPU of rank `rank` in this process's placement ([`place`]).
pub fn of(rank: usize) -> i32 {
    PLACED.get().map_or(0, |p| p.ordinal(rank))
}

/// One module per GPU that this process's ranks run on ([`of`]): a kernel launches on a
/// stream of the GPU its module was loaded on.
pub struct Modules {
    by_gpu: Vec<(i32, gdasync::gdsync::cuda::Module)>,
}

impl Modules {
    /// Compiles `src` for the GPUs of ranks `0..ranks`.
    pub fn compile(src: &str, ranks: usize) -> Result<Modules> {
        let mut by_gpu = Vec::new();
        for r in 0..ranks {
            let g = of(r);
            if by_gpu.iter().all(|(o, _)| *o != g) {
                let m = gdasync::gdsync::cuda::Module::compile(g, src)
                    .with_context(|| format!("compile the kernels with NVRTC for GPU {g}"))?;
                by_gpu.push((g, m));
            }
        }
        Ok(Modules { by_gpu })
    }

    /// Function `name` of rank `rank`'s GPU.
    pub fn function(&self, rank: usize, name: &str) -> Result<gdasync::gdsync::cuda::Function> {
        let g = of(rank);
        let (_, m) = self
            .by_gpu
            .iter()
            .find(|(o, _)| *o == g)
            .with_context(|| format!("no module was compiled for GPU {g} (rank {rank})"))?;
        Ok(m.function(name)?)
    }

    /// Function `name` of the GPUs of ranks 0 and 1.
    pub fn functions(&self, name: &str) -> Result<[gdasync::gdsync::cuda::Function; 2]> {
        Ok([self.function(0, name)?, self.function(1, name)?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_bad_ones_say_why() {
        assert_eq!(parse_list("0"), Ok(GpuList(vec![0])));
        assert_eq!(parse_list("1, 0"), Ok(GpuList(vec![1, 0])));
        assert!(parse_list("").unwrap_err().contains("not a GPU number"));
        assert!(parse_list("0,,1").unwrap_err().contains("not a GPU number"));
        assert!(parse_list("-1").unwrap_err().contains("not a GPU number"));
        assert!(parse_list("x").unwrap_err().contains("not a GPU number"));
        assert!(parse_list("99999")
            .unwrap_err()
            .contains("not a GPU number"));
        assert_eq!(parse_list("0,1,0"), Err("GPU 0 is listed twice".into()));
        let many: Vec<String> = (0..=MAX_GPUS).map(|g| g.to_string()).collect();
        assert!(parse_list(&many.join(",")).unwrap_err().contains("at most"));
    }

    #[test]
    fn ranks_go_round_robin_over_the_gpus() {
        let p = GpuArgs::default().resolve(2).unwrap();
        assert_eq!(p.label(4), "0,1,0,1");
        assert_eq!(p.sharing(0, 4), 2);
        assert_eq!(p.sharing(1, 3), 1);
        assert_eq!(p.used(0..4), vec![0, 1]);
        assert_eq!((p.job_gpus(4), p.job_gpus(1)), (2, 1));
        let one = GpuArgs {
            gpus: Some(GpuList(vec![1])),
        };
        let p = one.resolve(2).unwrap();
        assert_eq!((p.ordinal(0), p.ordinal(3), p.sharing(2, 4)), (1, 1, 4));
        let p = GpuArgs {
            gpus: Some(GpuList(vec![1, 0])),
        }
        .resolve(2)
        .unwrap();
        assert_eq!(p.label(3), "1,0,1");
    }

    #[test]
    fn a_gpu_that_is_not_here_is_an_error_naming_those_that_are() {
        let a = GpuArgs {
            gpus: Some(GpuList(vec![0, 2])),
        };
        let e = a.resolve(2).unwrap_err().to_string();
        assert_eq!(e, "--gpus: no GPU 2 on this machine (GPUs 0 to 1)");
        assert!(a.resolve(1).unwrap_err().to_string().contains("(GPU 0)"));
        assert!(GpuArgs::default().resolve(0).is_err());
    }

    #[test]
    fn mpi_ranks_take_the_launchers_local_rank() {
        let p = Placement {
            gpus: vec![0, 1],
            local: Some((3, "OMPI_COMM_WORLD_LOCAL_RANK")),
        };
        // Global rank 6 is this host's fourth rank: GPU 1.
        assert_eq!(p.ordinal(6), 1);
        assert_eq!(
            p.label(8),
            "local rank over 0,1 (OMPI_COMM_WORLD_LOCAL_RANK)"
        );
        assert_eq!(
            (p.job_gpus(8), p.job_gpus(1)),
            (2, 1),
            "the job's ranks, not this process's"
        );
    }
}

//! The doctor's checks of the machine, one function per step, before any queue pair is made:
//! rdma-core, the devices and their ports, `ulimit -l`, the GPU and its driver, how GPU memory
//! is registered (dma-buf or nvidia-peermem), whether the GPU can ring the HCA's doorbell
//! page, and whether inbound GPUDirect RDMA writes reach GPU memory in order. Where the
//! library has no query of its own, the doctor asks the system here (`getrlimit`,
//! `/proc`, `/sys`), so that each can be swapped for a library function later.

use crate::common::rdma::{yes, RdmaDevice};
use crate::step::{Status, Step};
use gdasync::gdsync::cuda::{nvrtc_available, Cuda, GpuCaps, InboundWrites, WRITES_ORDERING_OWNER};
use gdasync::gdsync::mlx5::{PortState as RdmaPortState, RdmaError};
use gdasync::gdsync::{peer_memory_loaded, GpuMemoryPath};

/// `ulimit -l` below this (and no CAP_IPC_LOCK) is a warning: rings and every registered host
/// buffer are pinned, and a registration past the limit fails with a bare ENOMEM.
const MEMLOCK_ENOUGH: u64 = 1 << 30;
/// The capability that lifts `ulimit -l` (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// The shared libraries of rdma-core this process loaded, with their versions: the file
/// names the dynamic loader resolved (`libibverbs.so.1.14.50.0`), read from `/proc/self/maps`.
fn loaded_rdma_libraries() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut found: Vec<String> = Vec::new();
    for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
        let file = std::fs::canonicalize(path).unwrap_or_else(|_| path.into());
        let Some(name) = file.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let ours = name.starts_with("libibverbs.so") || name.starts_with("libmlx5.so");
        if ours && !found.iter().any(|f| f == name) {
            found.push(name.to_string());
        }
    }
    found
}

/// The RDMA devices the kernel shows (`/sys/class/infiniband`), whatever user space finds.
fn kernel_rdma_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Step 1: rdma-core's libraries load, and which versions.
pub fn rdma_core(rdma: &Result<Vec<RdmaDevice>, RdmaError>) -> Step {
    const NAME: &str = "rdma-core";
    match rdma {
        Err(e @ (RdmaError::LibraryMissing { .. } | RdmaError::LibraryTooOld { .. })) => {
            let kernel = kernel_rdma_devices();
            // Without a device the soft device still works: only a machine with one needs it.
            let status = if kernel.is_empty() {
                Status::Warn
            } else {
                Status::Fail
            };
            let has = if kernel.is_empty() {
                "no RDMA device in /sys/class/infiniband".to_string()
            } else {
                format!("the kernel has {}", kernel.join(", "))
            };
            Step::new(
                status,
                NAME,
                "host",
                format!("{e}; {has}"),
                "install rdma-core 34 or newer (Debian/Ubuntu: apt-get install libibverbs1 ibverbs-providers), or MLNX_OFED/DOCA-OFED",
            )
        }
        _ => {
            let libs = loaded_rdma_libraries();
            let value = if libs.is_empty() {
                "loaded (versions not readable from /proc/self/maps)".to_string()
            } else {
                libs.join(", ")
            };
            Step::ok(NAME, "host", value)
        }
    }
}

/// Step 2: one line per port of every RDMA device (state, link layer, MTU, the GID chosen),
/// or one line saying there is none and the soft device stands in.
pub fn ports(rdma: &Result<Vec<RdmaDevice>, RdmaError>) -> Vec<Step> {
    const NAME: &str = "device and port";
    let none = |why: String| {
        vec![Step::new(
            Status::Warn,
            NAME,
            "soft",
            format!("{why}: the loopback steps run on the soft device"),
            "on a machine with a ConnectX, load its driver (mlx5_core, mlx5_ib; `ibv_devices` lists it) and run the doctor again",
        )]
    };
    let list = match rdma {
        Ok(l) if l.is_empty() => return none("no RDMA device: rdma-core found none".into()),
        Ok(l) => l,
        Err(e) => return none(e.to_string()),
    };
    let mut steps = Vec::new();
    for d in list {
        let ports = match &d.query {
            Ok((_, ports)) => ports,
            Err(e) => {
                steps.push(Step::new(
                    Status::Fail,
                    NAME,
                    &d.name,
                    format!("cannot open or query it: {e}"),
                    "check `ibv_devinfo -d` on it and the permissions of /dev/infiniband/uverbs*",
                ));
                continue;
            }
        };
        for p in ports {
            steps.push(port_step(&d.name, p));
        }
    }
    steps
}

fn port_step(device: &str, p: &crate::common::rdma::RdmaPort) -> Step {
    let about = format!("{device}:{}", p.info.port);
    let i = &p.info;
    let mut value = format!(
        "{}, {}, MTU {} (max {})",
        i.state, i.link_layer, i.active_mtu, i.max_mtu
    );
    let gid = match &p.gid {
        Ok(g) => format!(
            ", GID[{}] {} {} ({})",
            g.entry.index, g.entry.gid, g.entry.kind, g.why
        ),
        Err(e) => format!(", no GID: {e}"),
    };
    value.push_str(&gid);
    if i.state != RdmaPortState::Active {
        return Step::new(
            Status::Warn,
            "device and port",
            &about,
            value,
            "bring the link up (cable, switch port, subnet manager on InfiniBand; `ibstat` shows why), or use another port",
        );
    }
    if p.gid.is_err() {
        return Step::new(
            Status::Fail,
            "device and port",
            &about,
            value,
            "give the port an address (RoCE: an IP address on its netdev) or set GDSYNC_GID_INDEX to a valid entry (`show_gids`)",
        );
    }
    Step::ok("device and port", &about, value)
}

/// Whether this process may pin memory past `ulimit -l` (CAP_IPC_LOCK in its effective
/// capabilities, as root has).
fn can_lock_any() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .unwrap_or(0);
    eff & (1 << CAP_IPC_LOCK) != 0
}

/// `RLIMIT_MEMLOCK`'s soft limit in bytes, `None` for unlimited.
fn memlock_limit() -> Option<u64> {
    use gdasync::gdsync::MemlockLimit;
    match gdasync::gdsync::memlock_limit() {
        Some(MemlockLimit::Unlimited) => None,
        Some(MemlockLimit::Bytes(n)) => Some(n),
        None => Some(0),
    }
}

/// Step 3: `ulimit -l`.
pub fn memlock() -> Step {
    memlock_verdict(memlock_limit(), can_lock_any())
}

/// The memlock step for a limit (`None`: unlimited) and whether the limit binds this process.
pub fn memlock_verdict(limit: Option<u64>, exempt: bool) -> Step {
    const NAME: &str = "ulimit -l (RLIMIT_MEMLOCK)";
    let Some(bytes) = limit else {
        return Step::ok(NAME, "host", "unlimited");
    };
    let shown = format!("{} KiB", bytes / 1024);
    if exempt {
        return Step::ok(
            NAME,
            "host",
            format!("{shown}, not enforced: this process has CAP_IPC_LOCK"),
        );
    }
    if bytes >= MEMLOCK_ENOUGH {
        return Step::ok(NAME, "host", shown);
    }
    Step::new(
        Status::Warn,
        NAME,
        "host",
        format!("{shown}: rings and registered host buffers past it fail to register (ENOMEM)"),
        "raise it: `ulimit -l unlimited`, `* - memlock unlimited` in /etc/security/limits.conf, or `--ulimit memlock=-1` for a container",
    )
}

/// The NVIDIA kernel driver's version line (`/proc/driver/nvidia/version`), if loaded.
fn nvidia_kernel_driver() -> Option<String> {
    let v = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let first = v.lines().next()?;
    // "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."
    let version = first
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'));
    Some(version.unwrap_or(first).to_string())
}

/// Step 4: the GPU (GPU 0: the one the loopback steps use) and its driver.
pub fn gpu(cuda: &Result<&'static Cuda, String>) -> Step {
    const NAME: &str = "GPU and driver";
    let c = match cuda {
        Ok(c) if !c.gpus.is_empty() => c,
        Ok(_) => return Step::new(Status::Skip, NAME, "host", "CUDA loaded but no GPU", ""),
        Err(e) => return Step::new(Status::Skip, NAME, "host", format!("no GPU: {e}"), ""),
    };
    let g = &c.gpus[0];
    let kernel = nvidia_kernel_driver().unwrap_or_else(|| "not in /proc".into());
    let value = format!(
        "{} GPU(s); GPU 0 {} (sm_{}{}); CUDA driver {}.{}, kernel module {kernel}",
        c.gpus.len(),
        g.name,
        g.compute_capability.0,
        g.compute_capability.1,
        c.driver_version / 1000,
        (c.driver_version % 1000) / 10,
    );
    if !nvrtc_available() {
        return Step::new(
            Status::Warn,
            NAME,
            "GPU 0",
            format!("{value}; NVRTC missing: no kernel-initiated mode"),
            "install CUDA's NVRTC library (libnvrtc.so, package cuda-nvrtc) for kernel-initiated work",
        );
    }
    Step::ok(NAME, "GPU 0", value)
}

/// The running kernel's release (`uname -r`) and whether it is 5.12 or newer (dma-buf
/// registration of RDMA memory).
fn kernel_release() -> (String, bool) {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let r = r.trim().to_string();
    let mut n = r
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|x| x.parse::<u32>().ok());
    let (major, minor) = (n.next().unwrap_or(0), n.next().unwrap_or(0));
    let new_enough = (major, minor) >= (5, 12);
    (r, new_enough)
}

/// Step 5: how GPU memory becomes RDMA memory: a dma-buf (kernel 5.12+, and the GPU exports
/// one), else nvidia-peermem.
pub fn dma_buf(cuda: &Result<&'static Cuda, String>) -> Step {
    const NAME: &str = "GPU memory registration";
    let Some(g) = cuda.as_ref().ok().and_then(|c| c.gpus.first()) else {
        return Step::new(Status::Skip, NAME, "GPU 0", "no GPU", "");
    };
    let (release, kernel_ok) = kernel_release();
    let peermem = peer_memory_loaded();
    let value = format!(
        "kernel {release} (dma-buf from 5.12: {}), CUDA dma-buf export {}, nvidia-peermem loaded {}; {}",
        yes(kernel_ok),
        yes(g.caps.dma_buf),
        yes(peermem),
        gpu_payloads(kernel_ok && g.caps.dma_buf, peermem)
    );
    if (kernel_ok && g.caps.dma_buf) || peermem {
        return Step::ok(NAME, "GPU 0", value);
    }
    Step::new(
        Status::Warn,
        NAME,
        "GPU 0",
        format!("{value}: GPU memory cannot be registered for DMA"),
        "use Linux 5.12+ with the open NVIDIA kernel module (dma-buf), or load nvidia-peermem (`modprobe nvidia-peermem`); until then GPU payloads are staged through pinned host memory",
    )
}

/// How gdsync moves GPU payloads ([`GpuMemoryPath`]) on an mlx5 device and on the soft
/// device, as one phrase.
fn gpu_payloads(dma_buf: bool, peer_memory: bool) -> String {
    let say = |r: gdasync::gdsync::Result<(GpuMemoryPath, String)>| match r {
        Ok((p, why)) => format!("{p:?} ({why})"),
        Err(e) => e.to_string(),
    };
    format!(
        "GPU payloads on mlx5: {}, on the soft device: {}",
        say(GpuMemoryPath::choose_mlx5(None, dma_buf, peer_memory)),
        say(GpuMemoryPath::choose_soft(None))
    )
}

/// Step 7: whether a stream or kernel that saw a completion also sees the payload the HCA
/// wrote into GPU memory: ordered writes to the owner (>= 100), or a flush the GPU can do.
pub fn flush(cuda: &Result<&'static Cuda, String>) -> Step {
    const NAME: &str = "inbound write flush and ordering";
    let Some(g) = cuda.as_ref().ok().and_then(|c| c.gpus.first()) else {
        return Step::new(Status::Skip, NAME, "GPU 0", "no GPU", "");
    };
    flush_verdict(
        g.caps.gpudirect_rdma,
        g.caps.gpudirect_rdma_writes_ordering,
        g.caps.flush_remote_writes,
    )
}

/// The flush step for the GPU's capabilities: `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`,
/// `..._WRITES_ORDERING` and `..._CAN_FLUSH_REMOTE_WRITES`.
pub fn flush_verdict(gdr: bool, ordering: i32, can_flush: bool) -> Step {
    const NAME: &str = "inbound write flush and ordering";
    let value = format!(
        "GPUDirect RDMA {}, writes ordering {ordering}{}, flush remote writes {}",
        yes(gdr),
        if ordering >= WRITES_ORDERING_OWNER {
            " (OWNER or better)"
        } else {
            " (none)"
        },
        yes(can_flush)
    );
    if !gdr {
        return Step::new(
            Status::Warn,
            NAME,
            "GPU 0",
            format!("{value}: GPU memory is not an RDMA target here"),
            "use host memory for buffers the NIC writes, or a data-centre GPU with GPUDirect RDMA",
        );
    }
    // The library's own decision for a NIC that writes payloads apart from completions (a
    // ConnectX), so the doctor says what gdsync will do.
    let caps = GpuCaps {
        gpudirect_rdma: gdr,
        gpudirect_rdma_writes_ordering: ordering,
        flush_remote_writes: can_flush,
        ..GpuCaps::default()
    };
    match caps.inbound_writes(true) {
        InboundWrites::InOrder => Step::ok(
            NAME,
            "GPU 0",
            format!("{value}: inbound writes reach the GPU in order, no flush needed"),
        ),
        InboundWrites::Flush => Step::ok(
            NAME,
            "GPU 0",
            format!("{value}: waits flush inbound writes before the GPU reads them"),
        ),
        InboundWrites::Unordered => Step::new(
            Status::Warn,
            NAME,
            "GPU 0",
            format!("{value}: a stream or kernel could see a completion before its payload, so GPU memory is refused as an RDMA write target on mlx5 devices"),
            "receive into host memory (PinnedBuffer) and copy, or use a driver and GPU that report ordering 100 or a flush",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_to_the_owner_needs_no_flush() {
        // The H200 and H100 here: ordering 100, no flush: OK.
        let s = flush_verdict(true, 100, false);
        assert_eq!(s.status, Status::Ok, "{}", s.line());
        assert!(s.value.contains("no flush needed"));
        assert_eq!(flush_verdict(true, 0, true).status, Status::Ok);
        let neither = flush_verdict(true, 0, false);
        assert_eq!(neither.status, Status::Warn);
        assert!(!neither.fix.is_empty());
        assert_eq!(flush_verdict(false, 200, true).status, Status::Warn);
    }

    #[test]
    fn memlock_warns_below_a_gib_unless_exempt() {
        assert_eq!(memlock_verdict(None, false).status, Status::Ok);
        assert_eq!(memlock_verdict(Some(8 << 20), false).status, Status::Warn);
        assert_eq!(memlock_verdict(Some(8 << 20), true).status, Status::Ok);
        assert_eq!(memlock_verdict(Some(2 << 30), false).status, Status::Ok);
        assert!(memlock_verdict(Some(8 << 20), false)
            .value
            .starts_with("8192 KiB"));
    }
}

//! What a run needs before it starts: queue pairs on the device and host memory, checked
//! up front so that a rank count the machine cannot connect is refused with one line instead
//! of building for a minute and failing deep inside the connection set-up.
//!
//! Every rank connects to every other (the communicator's full mesh): per peer one QP for
//! messages and one for credits, with three completion queues.

use anyhow::{bail, Result};
use gdasync::gdsync::DeviceName;

/// Queue pairs a rank's communicator creates per peer (messages and credits).
const QPS_PER_PEER: usize = 2;

/// Host memory one rank's connection to one peer takes, in bytes: the message QP's rings
/// (512 receives of 64 bytes, 1024 send WQEBBs of 64 bytes), the credit QP's (256 WQEBBs),
/// their control pages, their work-request tables, and three completion queues (2048, 1024
/// and 64 entries of 64 bytes). About 333 KiB; rounded up for the allocator.
pub const BYTES_PER_CONNECTION: usize = 384 << 10;

/// Bytes of one shared-memory link between two processes' devices (two rings of 4 MiB).
pub const BYTES_PER_PROCESS_LINK: usize = 8 << 20;

/// What one run needs.
#[derive(Debug, PartialEq)]
pub struct Needs {
    /// Queue pairs on the busiest soft device.
    pub qps_per_device: usize,
    /// Host memory, all processes together.
    pub host_bytes: usize,
}

/// How the ranks of a run hold their devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// Threads of one process on one device.
    OneDevice,
    /// Threads of one process, a device each (in-process links between them).
    DevicePerThread,
    /// One process each, a device each (shared-memory links between them).
    Processes,
}

impl Sharing {
    /// Threads sharing one device, or processes.
    #[cfg(test)]
    pub fn of(threads: bool) -> Sharing {
        if threads {
            Sharing::OneDevice
        } else {
            Sharing::Processes
        }
    }
}

/// The needs of `ranks` ranks, `threads` of one process (sharing one device) or one process
/// each, plus `data_bytes` of grids.
#[cfg(test)]
pub fn needs(ranks: usize, threads: bool, data_bytes: usize) -> Needs {
    needs_with(ranks, Sharing::of(threads), data_bytes)
}

/// The needs of `ranks` ranks holding their devices as `sharing` says, plus `data_bytes` of
/// grids.
pub fn needs_with(ranks: usize, sharing: Sharing, data_bytes: usize) -> Needs {
    let peers = ranks.saturating_sub(1);
    let connections = ranks.saturating_mul(peers);
    let links = match sharing {
        Sharing::Processes => connections / 2 * BYTES_PER_PROCESS_LINK,
        _ => 0,
    };
    let one = sharing == Sharing::OneDevice;
    Needs {
        qps_per_device: QPS_PER_PEER * if one { connections } else { peers },
        host_bytes: connections
            .saturating_mul(BYTES_PER_CONNECTION)
            .saturating_add(links)
            .saturating_add(data_bytes),
    }
}

/// [`check_with`] for thread ranks on one device (`threads`) or processes.
#[cfg(test)]
pub fn check(device: &DeviceName, ranks: usize, threads: bool, data_bytes: usize) -> Result<()> {
    check_with(device, ranks, Sharing::of(threads), data_bytes)
}

/// Refuses a run of `ranks` ranks holding their devices as `sharing` says whose needs exceed
/// what the device serves or the memory this machine has available.
pub fn check_with(
    device: &DeviceName,
    ranks: usize,
    sharing: Sharing,
    data_bytes: usize,
) -> Result<()> {
    let n = needs_with(ranks, sharing, data_bytes);
    let max_qp = crate::common::device::open(device)?.query().max_qp as usize;
    if n.qps_per_device > max_qp {
        let fit = (1..=ranks)
            .rev()
            .find(|&r| needs_with(r, sharing, 0).qps_per_device <= max_qp)
            .unwrap_or(1);
        bail!(
            "--ranks {ranks}: a full mesh of {ranks} thread ranks needs {} queue pairs on their shared device ({device}), which serves at most {max_qp}: use at most {fit} ranks, or --ranks-as procs",
            n.qps_per_device
        );
    }
    if let Some(avail) = mem_available() {
        if n.host_bytes > avail {
            bail!(
                "--ranks {ranks}: the run needs about {} of host memory (queues of {} connections{}), and this machine has {} available",
                gib(n.host_bytes),
                ranks * ranks.saturating_sub(1),
                if data_bytes > 0 { ", and the grids" } else { "" },
                gib(avail)
            );
        }
    }
    Ok(())
}

/// Ranks per core from which a run is said to be oversubscribed: a few ranks per core take
/// turns without much loss (CI runs 4 on 2 cores), many do not.
pub const RANKS_PER_CORE_WARNED: usize = 4;

/// Why `ranks` ranks on `cores` cores will be slow, if they will: with many more ranks than
/// cores, ranks that poll for their halos take turns on the scheduler, and an iteration can
/// take tens of times longer (on a 2-core machine a new user saw 8 ms per iteration at 32
/// thread ranks and 220–430 ms at 64).
pub fn oversubscribed(ranks: usize, cores: usize) -> Option<String> {
    (ranks > cores.saturating_mul(RANKS_PER_CORE_WARNED)).then(|| {
        format!(
            "{ranks} ranks on {cores} cores: ranks that wait for their halos take turns on the \
             scheduler, so iterations can be many times slower than with a core per rank \
             (fewer --ranks, or more cores)"
        )
    })
}

/// `MemAvailable` of /proc/meminfo, in bytes (None where there is no such file).
fn mem_available() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

fn gib(b: usize) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_ranks_than_cores_is_said() {
        assert_eq!(oversubscribed(2, 2), None);
        assert_eq!(oversubscribed(8, 2), None);
        assert_eq!(oversubscribed(32, 64), None);
        assert!(oversubscribed(9, 2).is_some());
        let why = oversubscribed(64, 2).expect("said");
        assert!(why.starts_with("64 ranks on 2 cores: "), "{why}");
    }

    #[test]
    fn threads_share_one_device_processes_have_one_each() {
        let t = needs(4, true, 0);
        assert_eq!(t.qps_per_device, 2 * 4 * 3);
        assert_eq!(t.host_bytes, 12 * BYTES_PER_CONNECTION);
        let p = needs(4, false, 100);
        assert_eq!(p.qps_per_device, 2 * 3);
        assert_eq!(
            p.host_bytes,
            12 * BYTES_PER_CONNECTION + 6 * BYTES_PER_PROCESS_LINK + 100
        );
        assert_eq!(needs(1, true, 0).qps_per_device, 0);
    }

    #[test]
    fn threads_with_a_device_each_need_no_process_links() {
        let d = needs_with(4, Sharing::DevicePerThread, 100);
        assert_eq!(d.qps_per_device, 2 * 3);
        assert_eq!(d.host_bytes, 12 * BYTES_PER_CONNECTION + 100);
        assert!(check_with(&DeviceName::Soft, 200, Sharing::DevicePerThread, 0).is_ok());
    }

    #[test]
    fn too_many_thread_ranks_are_refused_with_the_largest_that_fits() {
        let e = check(&DeviceName::Soft, 200, true, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 181 ranks"), "{e}");
        assert!(check(&DeviceName::Soft, 2, true, 0).is_ok());
    }
}

//! The doctor: what works on this machine for GPUDirect Async, checked step by step, with the
//! fix for what does not. Run it first on a new machine, and paste its output (`--json` for
//! a script or a bug report) when something fails.
//!
//! ```text
//! cargo run --release --bin doctor
//! cargo run --release --bin doctor -- --json
//! ```
//!
//! Each step is one line: OK, WARN, FAIL or SKIP (could not run here: not a pass), the step,
//! what it is about (`host`, `GPU 0`, a device and port), the measured value, and on anything
//! but OK the fix in one sentence. In order: rdma-core, devices and ports, `ulimit -l`, the
//! GPU and driver, GPU memory registration, the GPU's mapping of the doorbell page, inbound
//! write ordering, then loopback writes on each active port (CPU-posted, stream-triggered
//! and kernel-initiated, into host and GPU memory, each checked byte for byte and timed), and
//! the verdict for each port. Without an RDMA device the loopback runs on the soft device.
//! Exit status: 0 when no step failed, 1 when one did, 2 for a wrong command line.

#[path = "../common/mod.rs"]
mod common;
mod loopback;
mod machine;
mod step;
mod uar;
mod verdict;

use anyhow::{bail, Result};
use clap::Parser;
use common::cli::{Mem, Trigger};
use common::json::{array, Object};
use common::out::outln;
use common::rdma::RdmaDevice;
use common::ToolArgs;
use gdasync::gdsync::cuda::{nvrtc_available, Cuda};
use gdasync::gdsync::mlx5::PortState as RdmaPortState;
use gdasync::gdsync::Device;
use std::process::ExitCode;
use step::{Status, Step};

#[derive(Parser)]
#[command(
    name = "doctor",
    version,
    about = "What works on this machine for GPUDirect Async, step by step, with the fix for what does not (exit status 1 when a step fails)"
)]
struct Args {
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Writes per loopback step (the p50 is of these).
    #[arg(long, default_value_t = 2000, value_parser = common::iters::count(64, 1_000_000))]
    writes: u64,
    #[command(flatten)]
    tool: ToolArgs,
}

/// The steps so far, printed as they come (text) or at the end (JSON).
struct Report {
    json: bool,
    steps: Vec<Step>,
}

impl Report {
    fn add(&mut self, s: Step) {
        if !self.json {
            outln!("{}", s.line());
        }
        self.steps.push(s);
    }
    fn count(&self, st: Status) -> usize {
        self.steps.iter().filter(|s| s.status == st).count()
    }
}

/// The loopback combinations, in the order they run.
const LOOPS: [(Trigger, Mem); 6] = [
    (Trigger::Cpu, Mem::Host),
    (Trigger::Cpu, Mem::Device),
    (Trigger::Stream, Mem::Host),
    (Trigger::Stream, Mem::Device),
    (Trigger::Kernel, Mem::Host),
    (Trigger::Kernel, Mem::Device),
];

/// The device ports the loopback runs on: every active port of every RDMA device, or the
/// soft device where there is none.
fn targets(rdma: &Result<Vec<RdmaDevice>, gdasync::gdsync::mlx5::RdmaError>) -> Vec<String> {
    let mut t = Vec::new();
    for d in rdma.iter().flatten() {
        if let Ok((_, ports)) = &d.query {
            t.extend(
                ports
                    .iter()
                    .filter(|p| p.info.state == RdmaPortState::Active)
                    .map(|p| format!("{}:{}", d.name, p.info.port)),
            );
        }
    }
    if t.is_empty() {
        t.push("soft".into());
    }
    t
}

/// The loopback step's name for trigger `t` into memory `m`.
fn loop_name(t: Trigger, m: Mem) -> String {
    let mem = if m == Mem::Host { "host" } else { "GPU" };
    format!("loopback {} write -> {mem} memory", common::name(t))
}

/// One loopback step on `dev` (`about`), and whether a stream was left waiting.
fn loop_step(
    about: &str,
    dev: &Device,
    t: Trigger,
    m: Mem,
    writes: usize,
    gpu: bool,
) -> (Step, bool) {
    let name = loop_name(t, m);
    if let Some(why) = loopback::cannot_run(t, m, gpu, nvrtc_available()) {
        return (Step::new(Status::Skip, &name, about, why, ""), false);
    }
    let r = loopback::run(dev, t, m, writes);
    let stalled = r.as_ref().is_err_and(|e| e.is::<loopback::Stalled>());
    (judge(&name, about, r), stalled)
}

/// A loopback's step: FAIL on an error or on any byte that differs, else OK with the p50.
fn judge(name: &str, about: &str, r: Result<loopback::Outcome>) -> Step {
    let fix = "fix what the message names; if it is unclear, send this output with --json (docs/hardware.md, First light)";
    let o = match r {
        Err(e) => return Step::new(Status::Fail, name, about, format!("{e:#}"), fix),
        Ok(o) => o,
    };
    if let Some((at, sent, got)) = o.mismatch {
        let v = format!(
            "{} writes completed but byte {at} differs: sent {sent:#04x}, landed {got:#04x}",
            o.writes
        );
        return Step::new(Status::Fail, name, about, v, fix);
    }
    let v = format!(
        "p50 {:.2} us post to completion, {} writes of 64 B, 4096 B checked",
        o.p50_us, o.writes
    );
    let mut s = Step::ok(name, about, v);
    s.p50_us = Some(o.p50_us);
    s
}

/// Prints the counts (text) or the whole report (JSON); the number of failed steps.
fn summary(r: &Report) -> usize {
    let (fails, warns, skips) = (
        r.count(Status::Fail),
        r.count(Status::Warn),
        r.count(Status::Skip),
    );
    if r.json {
        let o = Object::new()
            .set("version", env!("CARGO_PKG_VERSION"))
            .set("fail", fails)
            .set("warn", warns)
            .set("skip", skips)
            .set("steps", array(r.steps.iter().map(Step::json)));
        outln!("{o}");
    } else {
        outln!("doctor: {fails} FAIL, {warns} WARN, {skips} SKIP");
    }
    fails
}

fn run(args: &Args) -> Result<()> {
    let mut r = Report {
        json: args.json,
        steps: Vec::new(),
    };
    if !args.json {
        outln!(
            "gdasync {} doctor: status, step, [what it is about], measured value -- fix",
            env!("CARGO_PKG_VERSION")
        );
    }
    let cuda = Cuda::get().map(|c| &**c).map_err(|e| e.to_string());
    // The GID connections will use: the entry GDSYNC_GID_INDEX names (a value that is no
    // index fails the device's opening below, with the library's error), else the automatic one.
    let gid = std::env::var("GDSYNC_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok());
    let rdma = RdmaDevice::probe_with_gid(gid);
    r.add(machine::rdma_core(&rdma));
    machine::ports(&rdma).into_iter().for_each(|s| r.add(s));
    r.add(machine::memlock());
    r.add(machine::gpu(&cuda));
    r.add(machine::dma_buf(&cuda));
    let gpu = cuda.as_ref().is_ok_and(|c| !c.gpus.is_empty());
    let mut opened = Vec::new();
    for about in targets(&rdma) {
        match Device::open(&about) {
            Ok(dev) => {
                let (s, handler) = uar::step(&about, &dev, cuda.as_ref().ok().copied());
                r.add(s);
                opened.push((about, dev, handler));
            }
            Err(e) => r.add(Step::new(
                Status::Fail,
                "open the device",
                &about,
                e.to_string(),
                "see the device and port step above",
            )),
        }
    }
    r.add(machine::flush(&cuda));
    let writes = args.writes as usize;
    for (about, dev, handler) in &opened {
        let start = r.steps.len();
        for (t, m) in LOOPS {
            let (step, stalled) = loop_step(about, dev, t, m, writes, gpu);
            r.add(step);
            if stalled {
                // Nothing may be freed while a stream waits: report and end now.
                let fails = summary(&r);
                eprintln!("error: {fails} step(s) failed; a stream still waits, so the doctor stopped there");
                std::process::exit(1);
            }
        }
        let v = verdict::of(about, &r.steps[start..], *handler, gpu);
        r.add(v);
    }
    let fails = summary(&r);
    if fails > 0 {
        bail!("{fails} step(s) failed: see the FAIL lines and their fixes");
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    args.tool.run(|| run(&args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(mismatch: Option<(usize, u8, u8)>) -> Result<loopback::Outcome> {
        Ok(loopback::Outcome {
            p50_us: 1.5,
            writes: 2000,
            mismatch,
        })
    }

    #[test]
    fn a_byte_that_differs_fails_the_step_and_an_error_too() {
        let name = loop_name(Trigger::Stream, Mem::Device);
        assert_eq!(name, "loopback stream write -> GPU memory");
        let ok = judge(&name, "mlx5_0:1", outcome(None));
        assert_eq!((ok.status, ok.p50_us), (Status::Ok, Some(1.5)));
        let bad = judge(&name, "mlx5_0:1", outcome(Some((77, 0x31, 0x00))));
        assert_eq!(bad.status, Status::Fail);
        assert!(
            bad.value
                .contains("byte 77 differs: sent 0x31, landed 0x00"),
            "{}",
            bad.value
        );
        assert!(!bad.fix.is_empty() && bad.p50_us.is_none());
        let err = judge(&name, "soft", Err(anyhow::anyhow!("write 3: timed out")));
        assert_eq!(err.status, Status::Fail);
    }
}

//! The doctor's verdict for one device port: which triggers run here, and whether a stream's
//! or a kernel's doorbell is rung by the GPU itself or by the CPU proxy, and why; from the
//! loopback steps just run on it and the doorbell step.

use crate::step::{Status, Step};
use gdasync::gdsync::NicHandler;

/// How the loopback steps named `<trigger>` went on this port: "works", "FAILED", or why
/// not run.
fn outcome(loops: &[Step], trigger: &str) -> (Status, String) {
    let mine: Vec<&Step> = loops
        .iter()
        .filter(|s| s.name.starts_with(&format!("loopback {trigger} ")))
        .collect();
    if mine.iter().any(|s| s.status == Status::Fail) {
        return (Status::Fail, "FAILED (see above)".into());
    }
    let ran = mine.iter().filter(|s| s.status == Status::Ok).count();
    let skipped = mine.iter().find(|s| s.status != Status::Ok);
    match (ran, skipped) {
        (0, Some(s)) => (Status::Skip, format!("not run ({})", s.value)),
        (0, None) => (Status::Skip, "not run".into()),
        (_, Some(s)) => (
            Status::Ok,
            format!("works into host memory (GPU memory not run: {})", s.value),
        ),
        (_, None) => (Status::Ok, "works into host and GPU memory".into()),
    }
}

/// The verdict line for port `about`, after its loopback steps `loops`; `handler`: who rings
/// for GPU-posted work there (from the doorbell step), `gpu`: whether a GPU exists.
pub fn of(about: &str, loops: &[Step], handler: Option<NicHandler>, gpu: bool) -> Step {
    let (cpu_st, cpu) = outcome(loops, "cpu");
    let mut parts = vec![format!("cpu trigger: {cpu}")];
    let mut worst = cpu_st;
    let asked_cpu = std::env::var("GDSYNC_NIC_HANDLER").is_ok_and(|v| v == "cpu");
    let ringer = match (handler, asked_cpu) {
        (Some(NicHandler::Gpu), _) => "on the GPU (it rings the doorbell itself)",
        (Some(NicHandler::Cpu), true) => {
            "through the CPU proxy (GDSYNC_NIC_HANDLER=cpu asks for it)"
        }
        (Some(NicHandler::Cpu), false) => {
            "through the CPU proxy (the GPU may not map the doorbell page: see that step)"
        }
        (None, _) => "",
    };
    for t in ["stream", "kernel"] {
        let (st, how) = outcome(loops, t);
        if st == Status::Fail {
            worst = Status::Fail;
        }
        parts.push(if !gpu {
            format!("{t} trigger: needs a GPU (none here)")
        } else if st == Status::Ok {
            format!("{t} trigger: {how}, {ringer}")
        } else {
            format!("{t} trigger: {how}")
        });
    }
    if worst == Status::Fail {
        return Step::new(
            Status::Fail,
            "verdict",
            about,
            parts.join("; "),
            "send this output with --json, `ibv_devinfo -v` and `nvidia-smi -q` (docs/hardware.md, First light)",
        );
    }
    if gpu && handler == Some(NicHandler::Cpu) && !asked_cpu {
        return Step::new(
            Status::Warn,
            "verdict",
            about,
            parts.join("; "),
            "let the GPU map the doorbell page (the doorbell step's fix) to drop the proxy's hop and its CPU core",
        );
    }
    Step::ok("verdict", about, parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(name: &str, st: Status, v: &str) -> Step {
        Step::new(st, &format!("loopback {name}"), "soft", v, "")
    }

    #[test]
    fn a_failed_write_fails_the_verdict_and_a_skip_is_not_a_pass() {
        let cpu_ok = lp("cpu write -> host memory", Status::Ok, "p50");
        let skip = lp("stream write -> host memory", Status::Skip, "no GPU");
        let v = of("soft", &[cpu_ok.clone(), skip.clone()], None, false);
        assert_eq!(v.status, Status::Ok, "{}", v.line());
        assert!(v.value.contains("stream trigger: needs a GPU"));
        let bad = lp("cpu write -> host memory", Status::Fail, "byte 3 differs");
        let v = of("soft", &[bad, skip], None, false);
        assert_eq!(v.status, Status::Fail);
        let stream_ok = lp("stream write -> GPU memory", Status::Ok, "p50");
        let v = of(
            "mlx5_0:1",
            &[cpu_ok, stream_ok],
            Some(NicHandler::Cpu),
            true,
        );
        assert!(v.value.contains("through the CPU proxy"), "{}", v.value);
    }
}

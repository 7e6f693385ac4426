//! One step of the doctor's report: what it checked, on what (a device, a GPU, the host), what
//! it measured, how that went (OK, WARN, FAIL, or SKIP when it could not run) and, on
//! anything but OK, what to do in one sentence; printed as one line of text or one JSON
//! object.

use crate::common::json::{Object, Value};

/// How a step went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Checked, and works.
    Ok,
    /// Checked: works, with a limit or a slower path the fix removes.
    Warn,
    /// Checked, and does not work (or gave wrong bytes).
    Fail,
    /// Could not run here (no GPU, no NVRTC, an earlier step failed): not a pass.
    Skip,
}

impl Status {
    /// The word printed.
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug)]
pub struct Step {
    /// What was checked (`rdma-core`, `loopback cpu write -> host`).
    pub name: String,
    /// What it is about: `host`, `GPU 0`, `mlx5_0:1`, `soft`.
    pub about: String,
    pub status: Status,
    /// What was measured, or why it could not run.
    pub value: String,
    /// What to do, one sentence (empty on OK).
    pub fix: String,
    /// A loopback's median, µs (also in `value`), for scripts.
    pub p50_us: Option<f64>,
}

impl Step {
    /// A step that went well.
    pub fn ok(name: &str, about: &str, value: impl Into<String>) -> Step {
        Step::new(Status::Ok, name, about, value, "")
    }

    pub fn new(
        status: Status,
        name: &str,
        about: &str,
        value: impl Into<String>,
        fix: impl Into<String>,
    ) -> Step {
        Step {
            name: name.into(),
            about: about.into(),
            status,
            value: value.into(),
            fix: fix.into(),
            p50_us: None,
        }
    }

    /// The step as one line: `STATUS  name  [about]  value; fix: ...`.
    pub fn line(&self) -> String {
        let fix = if self.status == Status::Ok || self.fix.is_empty() {
            String::new()
        } else {
            format!(" -- fix: {}", self.fix)
        };
        format!(
            "{:<4}  {:<37} [{}] {}{fix}",
            self.status.word(),
            self.name,
            self.about,
            self.value
        )
    }

    pub fn json(&self) -> Object {
        let o = Object::new()
            .set("step", self.name.as_str())
            .set("about", self.about.as_str())
            .set("status", self.status.word())
            .set("value", self.value.as_str())
            .set("fix", self.fix.as_str());
        match self.p50_us {
            Some(p) => o.set("p50_us", Value::Fixed(p, 3)),
            None => o,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_the_fix_only_when_not_ok() {
        let ok = Step::ok("ulimit -l", "host", "unlimited");
        assert_eq!(
            ok.line().trim_end(),
            format!("OK    {:<37} [host] unlimited", "ulimit -l")
        );
        let w = Step::new(Status::Warn, "ulimit -l", "host", "8 MiB", "raise it.");
        assert!(w.line().starts_with("WARN  ulimit -l"));
        assert!(w.line().ends_with("8 MiB -- fix: raise it."));
        assert!(!w.line().contains('\n'));
    }
}

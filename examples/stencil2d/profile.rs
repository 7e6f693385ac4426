//! `--trace`'s accounting of where an iteration's time goes, beside the GPU events of the
//! stream trigger (gpu.rs, `Trace`): the CPU's time in each step of a rank's loop
//! ([`StepClock`], fed by the same step notes as the stall report), the memory operations a
//! rank hands its stream per iteration, by kind ([`Counted`]), and which threads of the
//! process burn CPU while the ranks iterate ([`ThreadCpu`]: rank threads, soft-device engines,
//! the CUDA driver's own).

use crate::progress::Step;
use gdasync::gdsync::cuda::stream_memops;
use gdasync::gdsync::exec::Executor;
use gdasync::gdsync::ops::{Op, Ops};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// The CPU's time in each step of a rank's loop (steps as [`Step`] numbers them).
pub struct StepClock {
    last: Option<(Step, Instant)>,
    spent: [Duration; Step::COUNT],
}

impl StepClock {
    pub fn new() -> StepClock {
        StepClock {
            last: None,
            spent: [Duration::ZERO; Step::COUNT],
        }
    }

    /// The rank's CPU enters `step`: the time since the last note goes to the step it left.
    pub fn enter(&mut self, step: Step) {
        let now = Instant::now();
        if let Some((s, t)) = self.last {
            self.spent[s as usize] += now - t;
        }
        self.last = Some((step, now));
    }

    /// `rank ...: CPU µs per iteration: step a | step b | ...` over `iters` iterations.
    pub fn line(&self, rank: usize, iters: u64) -> String {
        let n = iters.max(1) as f64;
        let mut parts = Vec::new();
        let mut total = 0.0;
        for (k, d) in self.spent.iter().enumerate() {
            if d.is_zero() {
                continue;
            }
            let us = d.as_secs_f64() * 1e6 / n;
            total += us;
            parts.push(format!("{} {us:.2}", Step::short(k)));
        }
        format!(
            "trace rank {rank}, CPU µs per iteration by step: {} | total {total:.2}",
            parts.join(" | ")
        )
    }
}

/// Memory operations handed to an executor, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCount {
    /// Lists handed over (each costs a stream a round of its front end).
    pub lists: u64,
    pub writes: u64,
    pub waits: u64,
    pub barriers: u64,
    pub doorbells: u64,
    /// Copies (staged payloads: in a list kernel, or between batches of memory operations).
    pub copies: u64,
}

impl OpCount {
    /// Counts `ops` as one list, as a stream runs it: without the barriers it drops (a
    /// stream's write fences by itself).
    pub fn add(&mut self, ops: &Ops) {
        self.lists += 1;
        let mut others = 0;
        for op in ops.as_slice() {
            match op {
                Op::Write32 { .. } | Op::Write64 { .. } => self.writes += 1,
                Op::Wait32 { .. } | Op::Wait64 { .. } => self.waits += 1,
                Op::Barrier => continue,
                Op::Doorbell { .. } => self.doorbells += 1,
                Op::Copy { .. } => self.copies += 1,
            }
            others += 1;
        }
        self.barriers += (stream_memops(ops.as_slice()) - others) as u64;
    }

    /// Every operation.
    pub fn ops(&self) -> u64 {
        self.writes + self.waits + self.barriers + self.doorbells
    }

    /// `rank ...: per iteration: n lists, m memory operations (w writes, ...)`.
    pub fn line(&self, rank: usize, iters: u64) -> String {
        let n = iters.max(1) as f64;
        let per = |x: u64| x as f64 / n;
        format!(
            "trace rank {rank}, stream work per iteration: {:.2} lists of memory operations, {:.2} operations ({:.2} writes, {:.2} waits, {:.2} barriers, {:.2} doorbells), 1 kernel",
            per(self.lists),
            per(self.ops()),
            per(self.writes),
            per(self.waits),
            per(self.barriers),
            per(self.doorbells)
        )
    }
}

/// An executor that counts what passes through it to `inner`.
pub struct Counted<'a, E: Executor> {
    pub inner: &'a E,
    pub count: Cell<OpCount>,
}

impl<'a, E: Executor> Counted<'a, E> {
    pub fn new(inner: &'a E) -> Self {
        Counted {
            inner,
            count: Cell::new(OpCount::default()),
        }
    }
}

impl<E: Executor> Executor for Counted<'_, E> {
    fn submit(&self, ops: Ops) -> gdasync::gdsync::Result<()> {
        let mut c = self.count.get();
        c.add(&ops);
        self.count.set(c);
        self.inner.submit(ops)
    }
}

/// CPU time of each thread of this process (Linux: `/proc/self/task`), to tell which spin.
pub struct ThreadCpu {
    at: Instant,
    ticks: Vec<(u32, String, u64)>,
}

impl ThreadCpu {
    /// Now.
    pub fn now() -> ThreadCpu {
        ThreadCpu {
            at: Instant::now(),
            ticks: threads(),
        }
    }

    /// The threads busy since `self` for more than a tenth of the wall time, busiest first:
    /// `name busy%`, one line, with how many threads the process has.
    pub fn since(&self) -> String {
        let wall = self.at.elapsed().as_secs_f64();
        let hz = clock_ticks_per_s();
        let now = threads();
        let mut busy: Vec<(f64, String)> = now
            .iter()
            .filter_map(|(tid, name, t)| {
                let before = self
                    .ticks
                    .iter()
                    .find(|(b, _, _)| b == tid)
                    .map_or(0, |x| x.2);
                let share = t.saturating_sub(before) as f64 / hz / wall.max(1e-9);
                (share > 0.1).then(|| (share, name.clone()))
            })
            .collect();
        busy.sort_by(|a, b| b.0.total_cmp(&a.0));
        let list: Vec<String> = busy
            .iter()
            .map(|(s, n)| format!("{n} {:.0}%", 100.0 * s))
            .collect();
        format!(
            "trace threads: {} threads in this process, {} busy over the timed run ({:.2} s; CPU time / wall time): {}",
            now.len(),
            busy.len(),
            wall,
            list.join(", ")
        )
    }
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// Every thread of this process: id, name, user + system CPU time in clock ticks.
fn threads() -> Vec<(u32, String, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let tid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        Some((tid, thread_name(&stat)?, cpu_ticks(&stat)?))
    })
    .collect()
}

/// The name in a `/proc/.../stat` line (between the first `(` and the last `)`).
fn thread_name(stat: &str) -> Option<String> {
    let (a, b) = (stat.find('(')?, stat.rfind(')')?);
    Some(stat.get(a + 1..b)?.to_string())
}

/// utime + stime of a `/proc/.../stat` line (fields 14 and 15, counted after the name).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split(' ').collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_name_and_cpu_time() {
        let stat = "4242 (rank 1) R 1 2 3 4 5 6 7 8 9 10 250 17 0 0 20 0 1 0";
        assert_eq!(thread_name(stat).as_deref(), Some("rank 1"));
        assert_eq!(cpu_ticks(stat), Some(267));
        let odd = "7 (a) b (c)) S 1 2 3 4 5 6 7 8 9 10 5 6 0 0";
        assert_eq!(thread_name(odd).as_deref(), Some("a) b (c)"));
        assert_eq!(cpu_ticks(odd), Some(11));
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn the_threads_are_listed_by_name() {
        // A listing of /proc/self/task can miss entries while other threads of the process
        // (the test harness's) start and end: a few looks, not one.
        let seen = std::thread::Builder::new()
            .name("probe-threads".into())
            .spawn(|| (0..20).any(|_| threads().iter().any(|(_, n, _)| n == "probe-threads")))
            .unwrap()
            .join()
            .unwrap();
        assert!(seen);
        assert!(ThreadCpu::now().since().contains("threads in this process"));
    }

    #[test]
    fn lists_are_counted_by_kind() {
        let mut c = OpCount::default();
        c.add(&Ops::barrier());
        c.add(&Ops::new());
        assert_eq!((c.lists, c.barriers, c.ops()), (2, 1, 1));
        assert!(c.line(0, 2).contains("1.00 lists"), "{}", c.line(0, 2));
        // A barrier a write follows is not a stream operation (the write fences by itself).
        let mut l = Ops::barrier();
        // SAFETY: the list is only counted, never run.
        unsafe { l.push_raw(Op::Write32 { addr: 8, value: 1 }) };
        c.add(&l);
        assert_eq!((c.lists, c.barriers, c.writes, c.ops()), (3, 1, 1, 2));
    }

    #[test]
    fn steps_take_the_time_until_the_next_note() {
        let mut s = StepClock::new();
        s.enter(Step::Send);
        let t = s.last.unwrap().1;
        s.enter(Step::Ring);
        let (_, t2) = s.last.unwrap();
        assert_eq!(s.spent[Step::Send as usize], t2 - t);
        assert_eq!(s.spent[Step::Ring as usize], Duration::ZERO);
        assert!(s
            .line(0, 1)
            .starts_with("trace rank 0, CPU µs per iteration by step:"));
    }
}

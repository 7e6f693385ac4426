//! pingpong's output: the header at once, then one row per size as soon as it is measured
//! (a table, or with `--json` one object per line carrying the header's fields). With
//! `--vs-raw`, each row adds the floor measured in the same run and the ratio to it. A row
//! whose figures cannot be trusted ends with `noisy: why` (`"noisy": true` in JSON; the rule
//! is in `common/noise.rs`).

use crate::common::header::Header;
use crate::common::json::{Object, Value};
use crate::common::out::outln;
use crate::common::stats::Stats;

/// Prints the rows of one run.
pub(crate) struct Report {
    header: Header,
    json: bool,
    vs_raw: bool,
}

const COLUMNS: &[&str] = &[
    "bytes",
    "iters",
    "t_min[us]",
    "t_max[us]",
    "t_p50[us]",
    "t_avg[us]",
    "t_stdev[us]",
    "t_p99[us]",
    "t_p99.9[us]",
    "cpu[us/iter]",
];
/// The columns `--vs-raw` adds.
const FLOOR_COLUMNS: &[&str] = &["raw_p50[us]", "p50/raw"];

impl Report {
    pub(crate) fn new(header: Header, json: bool, vs_raw: bool) -> Report {
        Report {
            header,
            json,
            vs_raw,
        }
    }

    /// The header and the column names (nothing with `--json`: every row carries the
    /// header's fields).
    pub(crate) fn header(&self) {
        if self.json {
            return;
        }
        outln!("{}", self.header.text());
        let floor = if self.vs_raw { FLOOR_COLUMNS } else { &[] };
        let names: Vec<String> = COLUMNS.iter().chain(floor).map(|c| c.to_string()).collect();
        outln!("{}", row(&names));
    }

    /// One size's row, with the floor measured beside it (`--vs-raw`).
    pub(crate) fn row(&self, s: &Stats, floor: Option<&Stats>) {
        if self.json {
            let f = |x: f64| Value::Fixed(x, 3);
            let mut o = Object::new()
                .extend(self.header.json())
                .set("bytes", s.bytes)
                .set("iters", s.iters)
                .set("t_min_us", f(s.min))
                .set("t_max_us", f(s.max))
                .set("t_p50_us", f(s.p50))
                .set("t_avg_us", f(s.avg))
                .set("t_stdev_us", f(s.stdev))
                .set("t_p99_us", f(s.p99))
                .set("t_p999_us", f(s.p999))
                .set("cpu_us_per_iter", f(s.cpu_us_per_iter))
                .set("noisy", s.noisy.is_some());
            if let Some(why) = &s.noisy {
                o = o.set("noisy_why", why.as_str());
            }
            if let Some(r) = floor {
                o = o
                    .set("raw_p50_us", f(r.p50))
                    .set("raw_p99_us", f(r.p99))
                    .set("p50_over_raw", Value::Fixed(s.p50 / r.p50, 2));
            }
            outln!("{o}");
        } else {
            let f = |x: f64| format!("{x:.3}");
            let mut cells = vec![
                s.bytes.to_string(),
                s.iters.to_string(),
                f(s.min),
                f(s.max),
                f(s.p50),
                f(s.avg),
                f(s.stdev),
                f(s.p99),
                f(s.p999),
                f(s.cpu_us_per_iter),
            ];
            if let Some(r) = floor {
                cells.extend([f(r.p50), format!("{:.2}", s.p50 / r.p50)]);
            }
            match &s.noisy {
                Some(why) => outln!("{}   noisy: {why}", row(&cells)),
                None => outln!("{}", row(&cells)),
            }
        }
    }
}

fn row(cells: &[String]) -> String {
    cells
        .iter()
        .enumerate()
        .map(|(k, c)| format!("{c:>w$}", w = if k < 2 { 10 } else { 12 }))
        .collect::<Vec<_>>()
        .join(" ")
}

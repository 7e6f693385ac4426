//! pingpong's output: the header at once, then one row per size as soon as it is measured
//! (a table, or with `--json` one object per line carrying the header's fields).

use crate::common::header::Header;
use crate::common::json::{Object, Value};
use crate::common::out::outln;
use crate::common::stats::Stats;

/// Prints the rows of one run.
pub(crate) struct Report {
    header: Header,
    json: bool,
}

const COLUMNS: [&str; 10] = [
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

impl Report {
    pub(crate) fn new(header: Header, json: bool) -> Report {
        Report { header, json }
    }

    /// The header and the column names (nothing with `--json`: every row carries the
    /// header's fields).
    pub(crate) fn header(&self) {
        if self.json {
            return;
        }
        outln!("{}", self.header.text());
        outln!("{}", row(COLUMNS.map(String::from)));
    }

    /// One size's row.
    pub(crate) fn row(&self, s: &Stats) {
        if self.json {
            let f = |x: f64| Value::Fixed(x, 3);
            let o = Object::new()
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
                .set("cpu_us_per_iter", f(s.cpu_us_per_iter));
            outln!("{o}");
        } else {
            let f = |x: f64| format!("{x:.3}");
            outln!(
                "{}",
                row([
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
                ])
            );
        }
    }
}

fn row(cells: [String; 10]) -> String {
    cells
        .iter()
        .enumerate()
        .map(|(k, c)| format!("{c:>w$}", w = if k < 2 { 10 } else { 12 }))
        .collect::<Vec<_>>()
        .join(" ")
}

//! `GDSYNC_LIST_PROFILE=1`: where a list kernel's time goes. Each launch of the list kernel
//! gets a row of stamps in GPU memory: the GPU's global timer at its start and end, and the
//! SM's cycle counter at its start and after each op. When the stream is dropped, the rows of
//! its last [`ROWS`] launches are summed up per list shape (the sequence of op kinds) and
//! logged at `info`: the median time of each op, and how long the stream took from one
//! launch's end to the next one's start. Cycles become nanoseconds by the ratio of the two
//! clocks over all rows (the global timer may tick only once a microsecond on some GPUs; the
//! cycle counter runs at the SM's clock). A wait's time includes waiting for the peer: in a
//! ping-pong it is the rest of the round trip.
//!
//! The stamps are plain stores into GPU memory by the thread that also makes the list's
//! ordered stores, so a release after them waits for them too; the cost is a few cycles per
//! op, but figures taken with profiling on are not the benchmark's figures.

use super::staging_kernels::{kind, LIST_OPS};
use super::DeviceBuffer;
use crate::Result;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Launches whose stamps are kept (a ring: older rows are overwritten).
pub(super) const ROWS: usize = 4096;
/// Stamps per row: two global-timer values, the start's cycle count, one per op.
const STAMPS: usize = LIST_OPS + 3;

/// The stamp rows of one stream's list kernels and the op kinds each row's launch ran.
pub(super) struct ListProfile {
    rows: DeviceBuffer,
    kinds: Mutex<Kinds>,
}

struct Kinds {
    /// Launches so far; launch `k` has row `k % ROWS`.
    launches: u64,
    of_row: Vec<Vec<u32>>,
}

impl ListProfile {
    /// Stamp rows on GPU `ordinal` where `GDSYNC_LIST_PROFILE` is `1`, else `None`.
    pub(super) fn from_env(ordinal: i32) -> Result<Option<Self>> {
        if crate::env::choice("GDSYNC_LIST_PROFILE", &["0", "1"])? != Some("1") {
            return Ok(None);
        }
        let rows = DeviceBuffer::alloc(ordinal, ROWS * STAMPS * 8)?;
        Ok(Some(ListProfile {
            rows,
            kinds: Mutex::new(Kinds {
                launches: 0,
                of_row: vec![Vec::new(); ROWS],
            }),
        }))
    }

    /// The row (a GPU address) for the next launch, which runs ops of kinds `kinds`.
    pub(super) fn row_for(&self, kinds: Vec<u32>) -> u64 {
        let mut k = self.kinds.lock();
        let row = (k.launches % ROWS as u64) as usize;
        k.launches += 1;
        k.of_row[row] = kinds;
        self.rows.ptr() + (row * STAMPS * 8) as u64
    }

    /// The summary of every row written, in launch order; `None` where none was. Call it once
    /// the stream has run everything launched (the rows are read as they are).
    pub(super) fn report(&self) -> Result<Option<String>> {
        let k = self.kinds.lock();
        let n = (k.launches as usize).min(ROWS);
        if n == 0 {
            return Ok(None);
        }
        let mut raw = vec![0u8; ROWS * STAMPS * 8];
        self.rows.copy_to_host(0, &mut raw)?;
        let stamp = |row: usize, i: usize| {
            let at = (row * STAMPS + i) * 8;
            u64::from_ne_bytes(raw[at..at + 8].try_into().expect("8 bytes"))
        };
        let first = (k.launches as usize).saturating_sub(ROWS);
        let rows: Vec<Row> = (first..k.launches as usize)
            .map(|l| l % ROWS)
            .map(|r| Row {
                kinds: k.of_row[r].clone(),
                start: stamp(r, 0),
                end: stamp(r, 1),
                cycles: (0..=k.of_row[r].len()).map(|i| stamp(r, 2 + i)).collect(),
            })
            // A launch that failed, or whose last stamp is not there yet, says nothing.
            .filter(|row| row.start != 0 && row.end >= row.start)
            .collect();
        if rows.is_empty() {
            return Ok(None);
        }
        Ok(Some(summarize(&rows)))
    }
}

/// One launch's stamps.
struct Row {
    kinds: Vec<u32>,
    /// Global timer (ns) at the start and the end.
    start: u64,
    end: u64,
    /// Cycle counter at the start and after each op.
    cycles: Vec<u64>,
}

/// Per shape, the median time of each op; and the median gap between launches.
fn summarize(rows: &[Row]) -> String {
    let (ns, cyc) = rows.iter().fold((0u64, 0u64), |(n, c), r| {
        let span = r.cycles.last().copied().unwrap_or(0);
        (
            n + r.end.saturating_sub(r.start),
            c + span.saturating_sub(r.cycles[0]),
        )
    });
    let ns_per_cycle = if cyc == 0 {
        0.0
    } else {
        ns as f64 / cyc as f64
    };
    let gaps: Vec<f64> = rows
        .windows(2)
        .filter(|w| w[1].start >= w[0].end)
        .map(|w| (w[1].start - w[0].end) as f64 / 1e3)
        .collect();
    let mut out = format!(
        "list kernel profile: {} launches, {:.3} ns per SM cycle; from one launch's end to the next one's start: median {:.2} µs, mean {:.2} µs",
        rows.len(),
        ns_per_cycle,
        median(gaps.clone()),
        mean(&gaps)
    );
    let mut shapes: BTreeMap<Vec<u32>, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        shapes.entry(r.kinds.clone()).or_default().push(r);
    }
    for (kinds, rs) in shapes {
        let _ = write!(out, "\n  {} launches:", rs.len());
        for (i, k) in kinds.iter().enumerate() {
            let us = rs
                .iter()
                .map(|r| r.cycles[i + 1].saturating_sub(r.cycles[i]) as f64 * ns_per_cycle / 1e3)
                .collect();
            let _ = write!(out, " {} {:.2}", kind_name(*k), median(us));
        }
        let whole = rs
            .iter()
            .map(|r| r.end.saturating_sub(r.start) as f64 / 1e3)
            .collect();
        let _ = write!(out, " (whole launch {:.2} µs)", median(whole));
    }
    out
}

fn kind_name(k: u32) -> &'static str {
    match k {
        kind::W32 => "w32",
        kind::W64 => "w64",
        kind::WAIT32 => "wait32",
        kind::WAIT64 => "wait64",
        kind::FENCE => "fence",
        kind::COPY => "copy",
        _ => "?",
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_takes_1_or_0() {
        let v = |s| crate::env::choice_of("GDSYNC_LIST_PROFILE", Some(s), &["0", "1"]);
        assert_eq!(v("1").unwrap(), Some("1"));
        let e = v("yes").unwrap_err().to_string();
        assert!(e.contains("GDSYNC_LIST_PROFILE") && e.contains('1'), "{e}");
    }

    #[test]
    fn a_summary_gives_each_op_its_median_and_the_gap_between_launches() {
        // 2 ns per cycle: 1000 ns of timer over 500 cycles.
        let row = |start: u64| Row {
            kinds: vec![kind::WAIT64, kind::COPY],
            start,
            end: start + 1000,
            cycles: vec![0, 400, 500],
        };
        let s = summarize(&[row(0), row(3000), row(6000)]);
        assert!(s.contains("3 launches, 2.000 ns per SM cycle"), "{s}");
        assert!(s.contains("median 2.00 µs"), "{s}");
        assert!(
            s.contains("wait64 0.80 copy 0.20 (whole launch 1.00 µs)"),
            "{s}"
        );
    }
}

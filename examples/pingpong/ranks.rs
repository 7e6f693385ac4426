//! The measurement loop both ranks run, with the bootstrap separating sizes: per size, a
//! warm-up, then `--iters` round trips or as many as fit in `--duration`, then the figures
//! (rank 0 reports them at once). With `--vs-raw`, blocks of round trips alternate between
//! the wire and the `--raw` floor, so that both are measured under the same conditions.

use super::wire::Wire;
use super::{Args, MAX_SAMPLES};
use crate::common::noise::involuntary_switches;
use crate::common::stats::{cpu_time_us, Stats};
use anyhow::{Context, Result};
use gdasync::mp::bootstrap::Bootstrap;
use std::time::{Duration, Instant};

/// Round trips in the first chunk of a `--duration` run; later chunks are sized from the
/// measured rate to end near the deadline.
const FIRST_CHUNK: u64 = 64;
/// Timed round trips in a block of `--vs-raw` (short enough that a change in the machine's
/// load or the threads' placement shows in both series).
const FLOOR_BLOCK: u64 = 5000;
/// Untimed round trips of the floor before each of its blocks, per timed one: they let the
/// device's threads settle (an engine that served a peer process keeps looking for a couple
/// of milliseconds after its last packet), so that the floor is not measured beside them.
const FLOOR_SETTLE: u64 = 4;
/// Untimed round trips on the device before each of its blocks but the first.
const DEVICE_WARMUP: u64 = 100;

/// Runs every size on rank `rank`; rank 0 hands each size's figures (and the floor's, with
/// `floor`) to `emit` as soon as they are measured. `own_cpu`: whether this rank's CPU time
/// is not already counted by rank 0's (ranks in separate processes).
pub(crate) fn run_rank<'w>(
    rank: usize,
    w: &mut dyn Wire,
    mut floor: Option<&mut (dyn Wire + 'w)>,
    args: &Args,
    boot: &mut dyn Bootstrap,
    own_cpu: bool,
    emit: &mut dyn FnMut(Stats, Option<Stats>) -> Result<()>,
) -> Result<()> {
    // (Each wire numbers its own messages: a marker left in one wire's buffer by an earlier
    // block is never mistaken for the next message of the other.)
    let (mut i, mut j) = (0u64, 0u64);
    for size in args.sizes() {
        w.reset(size)?;
        if let Some(f) = floor.as_deref_mut() {
            f.reset(size)?;
        }
        boot.barrier().context("start of a size")?;
        let warmup = args.warmup(size) as u64;
        round_trips(rank, w, &mut i, size, warmup, None)?;
        if let Some(f) = floor.as_deref_mut() {
            round_trips(rank, f, &mut j, size, warmup, None)?;
        }
        let switches0 = involuntary_switches();
        let (samples, cpu, floor_samples) = match (args.duration, floor.as_deref_mut()) {
            (Some(d), _) => {
                let cpu0 = cpu_time_us();
                let s = for_duration(rank, w, &mut i, size, d, boot)?;
                (s, cpu_time_us() - cpu0, None)
            }
            (None, f) => {
                let n = args.iters(size) as u64;
                alternating(rank, w, f, (&mut i, &mut j), size, n)?
            }
        };
        let switches = involuntary_switches().saturating_sub(switches0);
        let cpu = cpu / samples.len().max(1) as f64;
        w.drain()?;
        let mine = if own_cpu || rank == 0 { cpu } else { 0.0 };
        let all = boot
            .all_gather(&mine.to_le_bytes())
            .context("end of a size")?;
        if rank == 0 {
            let total: f64 = all
                .iter()
                .filter_map(|b| Some(f64::from_le_bytes(b.as_slice().try_into().ok()?)))
                .sum();
            let floor = floor_samples.map(|s| Stats::new(size, s, 0.0));
            emit(
                Stats::new(size, samples, total).with_switches(switches),
                floor,
            )?;
        }
    }
    Ok(())
}

/// `n` timed round trips on `w`; with a `floor`, as many on it too, in alternating blocks.
/// Returns the samples, the CPU time (µs) spent on `w`'s and the floor's samples.
fn alternating(
    rank: usize,
    w: &mut dyn Wire,
    floor: Option<&mut (dyn Wire + '_)>,
    (i, j): (&mut u64, &mut u64),
    size: usize,
    n: u64,
) -> Result<(Vec<f64>, f64, Option<Vec<f64>>)> {
    let mut s = Vec::with_capacity(n as usize);
    let Some(f) = floor else {
        let cpu0 = cpu_time_us();
        round_trips(rank, w, i, size, n, Some(&mut s))?;
        return Ok((s, cpu_time_us() - cpu0, None));
    };
    let (mut fs, mut cpu) = (Vec::with_capacity(n as usize), 0.0);
    while (s.len() as u64) < n {
        let block = FLOOR_BLOCK.min(n - s.len() as u64);
        if !s.is_empty() {
            round_trips(rank, w, i, size, DEVICE_WARMUP, None)?;
        }
        let cpu0 = cpu_time_us();
        round_trips(rank, w, i, size, block, Some(&mut s))?;
        cpu += cpu_time_us() - cpu0;
        round_trips(rank, f, j, size, FLOOR_SETTLE * block, None)?;
        round_trips(rank, f, j, size, block, Some(&mut fs))?;
    }
    Ok((s, cpu, Some(fs)))
}

/// `n` round trips starting at message `*i`; their half round trips (µs) go to `samples`.
fn round_trips(
    rank: usize,
    w: &mut dyn Wire,
    i: &mut u64,
    size: usize,
    n: u64,
    mut samples: Option<&mut Vec<f64>>,
) -> Result<()> {
    for _ in 0..n {
        let t0 = Instant::now();
        if rank == 0 {
            w.send(*i, size)?;
            w.wait(*i + 1, size)?;
        } else {
            w.wait(*i, size)?;
            w.send(*i + 1, size)?;
        }
        *i += 2;
        if let Some(s) = samples.as_deref_mut() {
            s.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    Ok(())
}

/// Round trips in chunks until `d` has passed (or [`MAX_SAMPLES`] were taken): after each
/// chunk rank 0 sizes the next from the rate so far, 0 to stop, and both ranks follow it.
fn for_duration(
    rank: usize,
    w: &mut dyn Wire,
    i: &mut u64,
    size: usize,
    d: Duration,
    boot: &mut dyn Bootstrap,
) -> Result<Vec<f64>> {
    let mut samples = Vec::new();
    let (start, mut busy) = (Instant::now(), Duration::ZERO);
    let mut chunk = FIRST_CHUNK;
    while chunk > 0 {
        let t = Instant::now();
        round_trips(rank, w, i, size, chunk, Some(&mut samples))?;
        busy += t.elapsed();
        let next = if rank == 0 {
            let left = d.saturating_sub(start.elapsed());
            let per = busy.as_secs_f64() / samples.len() as f64;
            let room = MAX_SAMPLES - samples.len() as u64;
            (left.as_secs_f64() / per).min(room as f64) as u64
        } else {
            0
        };
        let all = boot
            .all_gather(&next.to_le_bytes())
            .context("--duration: agreeing on the next chunk")?;
        chunk = all
            .first()
            .and_then(|b| Some(u64::from_le_bytes(b.as_slice().try_into().ok()?)))
            .context("--duration: a malformed chunk size from rank 0")?
            .min(MAX_SAMPLES - samples.len() as u64);
    }
    Ok(samples)
}

//! The problem and its decomposition: which rank owns which block, where its halos are,
//! the initial values, and the update every variant computes with the same arithmetic.

use std::ops::Range;

/// The weights of the update (weighted Jacobi, ω = 2/3): `new = C0·u + C1·(n + s + w + e)`.
/// The sum of two products is what a compiler would contract into a fused multiply-add, so
/// GPU kernels are compiled with `--fmad=false` to give the CPU's bits.
pub const C0: f64 = 1.0 / 3.0;
/// See [`C0`].
pub const C1: f64 = 1.0 / 6.0;

/// One cell's update, in the one evaluation order every variant uses (the CUDA kernels
/// spell out the same expression).
#[inline(always)]
pub fn update(cur: &[f64], nxt: &mut [f64], i: usize, stride: usize) {
    let sum = (cur[i - stride] + cur[i + stride]) + (cur[i - 1] + cur[i + 1]);
    nxt[i] = C0 * cur[i] + C1 * sum;
}

/// A side of a rank's block, and the neighbour across it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    North,
    South,
    West,
    East,
}

impl Side {
    pub const ALL: [Side; 4] = [Side::North, Side::South, Side::West, Side::East];
    /// Rows are contiguous; columns are strided (packed for sending).
    pub fn is_row(self) -> bool {
        matches!(self, Side::North | Side::South)
    }
}

/// `parts` nearly equal blocks of `n`: the `k`-th.
fn split(n: usize, parts: usize, k: usize) -> Range<usize> {
    k * n / parts..(k + 1) * n / parts
}

/// `px × py` with `px · py = ranks`, as square as possible (`px ≥ py`); `ranks × 1` (row
/// strips, a 1D decomposition) when `ranks` is prime.
pub fn decompose(ranks: usize) -> (usize, usize) {
    let py = (1..=ranks)
        .take_while(|d| d * d <= ranks)
        .filter(|d| ranks % d == 0)
        .last()
        .unwrap_or(1);
    (ranks / py, py)
}

/// One rank's block of the global `gx × gy` grid (rows × columns), stored with a one-cell
/// halo: `(nx + 2) × (ny + 2)` values, row-major; owned cells are rows `1..=nx`, columns
/// `1..=ny`.
#[derive(Clone, Debug)]
pub struct Layout {
    pub gx: usize,
    pub gy: usize,
    /// Global row and column of the first owned cell.
    pub row0: usize,
    pub col0: usize,
    pub nx: usize,
    pub ny: usize,
    /// The rank across each side (by `Side as usize`), or none at the global boundary.
    pub neighbours: [Option<usize>; 4],
}

impl Layout {
    pub fn new(gx: usize, gy: usize, px: usize, py: usize, rank: usize) -> Layout {
        let (pr, pc) = (rank / py, rank % py);
        let (rows, cols) = (split(gx, px, pr), split(gy, py, pc));
        let at = |r: usize, c: usize| r * py + c;
        Layout {
            gx,
            gy,
            row0: rows.start,
            col0: cols.start,
            nx: rows.len(),
            ny: cols.len(),
            neighbours: [
                (pr > 0).then(|| at(pr - 1, pc)),
                (pr + 1 < px).then(|| at(pr + 1, pc)),
                (pc > 0).then(|| at(pr, pc - 1)),
                (pc + 1 < py).then(|| at(pr, pc + 1)),
            ],
        }
    }

    /// A single rank owning the whole grid (the reference of `--check`).
    pub fn whole(gx: usize, gy: usize) -> Layout {
        Layout::new(gx, gy, 1, 1, 0)
    }

    pub fn stride(&self) -> usize {
        self.ny + 2
    }
    pub fn cells(&self) -> usize {
        (self.nx + 2) * (self.ny + 2)
    }
    /// Values along `side` (one halo row or column).
    pub fn side_len(&self, side: Side) -> usize {
        if side.is_row() {
            self.ny
        } else {
            self.nx
        }
    }
    /// The neighbours, with the side each is across.
    pub fn links(&self) -> impl Iterator<Item = (Side, usize)> + '_ {
        Side::ALL
            .into_iter()
            .filter_map(|s| self.neighbours[s as usize].map(|p| (s, p)))
    }

    /// Grid indices along `side`: the owned cells next to it (`halo = false`, what is sent)
    /// or the halo cells (`halo = true`, what is received).
    pub fn side_cells(&self, side: Side, halo: bool) -> impl Iterator<Item = usize> + '_ {
        let s = self.stride();
        let (row, col) = match (side, halo) {
            (Side::North, false) => (Some(1), None),
            (Side::North, true) => (Some(0), None),
            (Side::South, false) => (Some(self.nx), None),
            (Side::South, true) => (Some(self.nx + 1), None),
            (Side::West, false) => (None, Some(1)),
            (Side::West, true) => (None, Some(0)),
            (Side::East, false) => (None, Some(self.ny)),
            (Side::East, true) => (None, Some(self.ny + 1)),
        };
        (0..self.side_len(side)).map(move |k| match (row, col) {
            (Some(r), _) => r * s + 1 + k,
            (_, Some(c)) => (1 + k) * s + c,
            _ => unreachable!(),
        })
    }

    /// The initial block with its halo: owned cells, and the fixed global boundary values
    /// where the halo lies on the global boundary.
    pub fn initial_grid(&self) -> Vec<f64> {
        let s = self.stride();
        let mut g = vec![0.0; self.cells()];
        for r in 0..self.nx + 2 {
            for c in 0..s {
                let gr = (self.row0 + r) as i64 - 1;
                let gc = (self.col0 + c) as i64 - 1;
                g[r * s + c] = initial(gr, gc, self.gx as i64, self.gy as i64);
            }
        }
        g
    }

    /// The owned cells of `grid`, row by row (`nx · ny` values).
    pub fn owned(&self, grid: &[f64]) -> Vec<f64> {
        let s = self.stride();
        (1..=self.nx)
            .flat_map(|r| grid[r * s + 1..r * s + 1 + self.ny].iter().copied())
            .collect()
    }

    /// The largest block of this decomposition (rows × columns).
    pub fn largest_block(gx: usize, gy: usize, px: usize, py: usize) -> (usize, usize) {
        (gx.div_ceil(px), gy.div_ceil(py))
    }
}

/// The value of global cell (`gr`, `gc`) at the start (`-1` and `gx`/`gy` are the fixed
/// boundary): hot top edge, warm sides, cold bottom, pseudo-random interior in [0, 1).
pub fn initial(gr: i64, gc: i64, gx: i64, gy: i64) -> f64 {
    if gr < 0 {
        1.0
    } else if gr >= gx {
        0.0
    } else if gc < 0 {
        0.25
    } else if gc >= gy {
        0.75
    } else {
        // splitmix64 of the cell number: exact, the same on every rank.
        let mut z = (gr as u64)
            .wrapping_mul(gy as u64)
            .wrapping_add(gc as u64)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// `f64`s as native-endian bytes (what registered buffers and device copies move).
pub fn to_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// The inverse of [`to_bytes`].
pub fn from_bytes(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8)
        .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// The owned cells of the boundary ring of a block: rows 1 and `nx`, columns 1 and `ny`
/// (each cell once), in the order the GPU's boundary kernel numbers them.
pub fn ring_cell(nx: usize, ny: usize, k: usize) -> (usize, usize) {
    if k < ny {
        (1, 1 + k)
    } else if nx > 1 && k < 2 * ny {
        (nx, 1 + k - ny)
    } else {
        let j = k - ny * nx.min(2);
        let rows = nx - 2;
        if j < rows {
            (2 + j, 1)
        } else {
            (2 + j - rows, ny)
        }
    }
}

/// How many cells [`ring_cell`] numbers.
pub fn ring_len(nx: usize, ny: usize) -> usize {
    ny * nx.min(2) + nx.saturating_sub(2) * ny.min(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_is_every_edge_cell_once() {
        for (nx, ny) in [
            (1, 1),
            (1, 5),
            (5, 1),
            (2, 2),
            (2, 7),
            (7, 2),
            (3, 3),
            (6, 9),
        ] {
            let mut got: Vec<_> = (0..ring_len(nx, ny))
                .map(|k| ring_cell(nx, ny, k))
                .collect();
            got.sort();
            let mut want: Vec<_> = (1..=nx)
                .flat_map(|r| (1..=ny).map(move |c| (r, c)))
                .filter(|&(r, c)| r == 1 || r == nx || c == 1 || c == ny)
                .collect();
            want.sort();
            assert_eq!(got, want, "{nx}x{ny}");
        }
    }

    #[test]
    fn decompositions_are_square_or_strips() {
        assert_eq!(decompose(1), (1, 1));
        assert_eq!(decompose(2), (2, 1));
        assert_eq!(decompose(4), (2, 2));
        assert_eq!(decompose(6), (3, 2));
        assert_eq!(decompose(7), (7, 1));
        assert_eq!(decompose(16), (4, 4));
    }

    #[test]
    fn blocks_tile_the_grid_and_neighbours_agree() {
        let (gx, gy, px, py) = (37, 23, 3, 2);
        let mut covered = vec![0u8; gx * gy];
        for r in 0..px * py {
            let l = Layout::new(gx, gy, px, py, r);
            for i in 0..l.nx {
                for j in 0..l.ny {
                    covered[(l.row0 + i) * gy + l.col0 + j] += 1;
                }
            }
            for (side, p) in l.links() {
                let o = Layout::new(gx, gy, px, py, p);
                let back = match side {
                    Side::North => Side::South,
                    Side::South => Side::North,
                    Side::West => Side::East,
                    Side::East => Side::West,
                };
                assert_eq!(o.neighbours[back as usize], Some(r));
                assert_eq!(o.side_len(back), l.side_len(side));
            }
        }
        assert!(covered.iter().all(|&c| c == 1));
    }
}

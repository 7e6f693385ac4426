//! Bounds of a memory region's own accessors at the edges of `usize`: offsets near
//! `usize::MAX`, zero lengths, inverted ranges and inclusive ranges ending at `usize::MAX`
//! are errors (or the documented panic), and never touch a byte outside the region.

use crate::{Access, Device, MemoryRegion};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

const LEN: usize = 64;
/// Bytes around the region that must keep their value.
const GUARD: usize = 64;
const CANARY: u8 = 0xA5;

/// Offsets and lengths where arithmetic breaks, and ordinary ones.
fn edge() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(LEN),
        Just(usize::MAX),
        (usize::MAX - 2 * LEN..=usize::MAX),
        0usize..=2 * LEN,
        any::<usize>(),
    ]
}

/// Runs `f` on a region of [`LEN`] bytes between two guard zones, then checks the guards.
fn with_guarded_region(f: impl FnOnce(&MemoryRegion<'_>)) {
    let dev = Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let mut buf = [CANARY; GUARD + LEN + GUARD];
    {
        let (below, rest) = buf.split_at_mut(GUARD);
        let (region, above) = rest.split_at_mut(LEN);
        let mr = pd.register(region, Access::LOCAL_WRITE).unwrap();
        f(&mr);
        assert!(below.iter().chain(above.iter()).all(|&b| b == CANARY));
    }
}

#[test]
fn accessors_refuse_what_does_not_fit() {
    with_guarded_region(|mr| {
        let mut runner = TestRunner::default();
        runner
            .run(&(edge(), 0usize..=2 * LEN), |(off, len)| {
                let fits = (off as u128 + len as u128) <= LEN as u128;
                let src = vec![0x5Au8; len];
                prop_assert_eq!(mr.try_write_at(off, &src).is_ok(), fits);
                let mut dst = vec![0u8; len];
                prop_assert_eq!(mr.try_read_at(off, &mut dst).is_ok(), fits);
                Ok(())
            })
            .unwrap();
    });
}

#[test]
fn sge_ranges_at_the_edges() {
    with_guarded_region(|mr| {
        let mut runner = TestRunner::default();
        runner
            .run(&(edge(), edge()), |(a, b)| {
                let ok = |s: u128, e: u128| s <= e && e <= LEN as u128;
                let (wa, wb) = (a as u128, b as u128);
                let half_open = mr.try_sge(a..b);
                prop_assert_eq!(half_open.is_ok(), ok(wa, wb));
                if let Ok(s) = half_open {
                    prop_assert_eq!(s.addr, mr.addr() + a as u64);
                    prop_assert_eq!(s.len as usize, b - a);
                }
                prop_assert_eq!(mr.try_sge(a..=b).is_ok(), ok(wa, wb + 1));
                prop_assert_eq!(mr.try_sge(..=b).is_ok(), ok(0, wb + 1));
                prop_assert_eq!(mr.try_sge(a..).is_ok(), ok(wa, LEN as u128));
                Ok(())
            })
            .unwrap();
    });
}

#[test]
fn named_edges() {
    with_guarded_region(|mr| {
        assert!(mr.try_sge(..=usize::MAX).is_err(), "not an empty SGE");
        assert!(mr.try_sge(..).is_ok_and(|s| s.len as usize == LEN));
        assert!(mr.try_sge(LEN..LEN).is_ok_and(|s| s.len == 0));
        #[allow(clippy::reversed_empty_ranges)]
        let inverted = mr.try_sge(9..3);
        assert!(inverted.is_err());
        let e = mr.try_write_at(usize::MAX, &[1]).unwrap_err().to_string();
        assert!(e.contains("outside the region of 64 bytes"), "{e}");
        assert!(
            mr.try_write_at(LEN, &[]).is_ok(),
            "an empty write at the end fits"
        );
        assert!(mr.try_read_at(LEN + 1, &mut []).is_err());
        mr.write_at(0, &[7; LEN]);
        let mut back = [0u8; LEN];
        mr.read_at(0, &mut back);
        assert_eq!(back, [7; LEN]);
    });
}

#[test]
#[should_panic(expected = "outside the region")]
fn sge_to_usize_max_panics() {
    with_guarded_region(|mr| {
        mr.sge(..=usize::MAX);
    });
}

#[test]
#[should_panic(expected = "outside the region")]
fn write_near_usize_max_panics() {
    with_guarded_region(|mr| mr.write_at(usize::MAX - 3, &[1, 2, 3, 4, 5]));
}

#[test]
fn remote_addresses_wrap_instead_of_overflowing() {
    let r = crate::RemoteBuf {
        addr: u64::MAX - 1,
        len: 8,
        rkey: 1,
    };
    assert_eq!(r.at(3).addr, 1);
}

//! Bounds arithmetic that cannot overflow: whether `len` bytes at an offset lie inside a
//! buffer, and a `RangeBounds` resolved against a length. Every bounds check of the crate goes
//! through these, so an offset near `usize::MAX` is refused instead of wrapping around to an
//! address before the buffer.

use std::ops::{Bound, Range, RangeBounds};

/// Whether `len` bytes at `offset` lie inside `total` bytes (false when the end overflows).
pub(crate) fn fits(offset: usize, len: usize, total: usize) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= total)
}

/// `range` as `start..end` inside `0..total`; `None` when a bound overflows (`..=usize::MAX`),
/// the range is inverted, or it ends past `total`.
pub(crate) fn resolve(range: &impl RangeBounds<usize>, total: usize) -> Option<Range<usize>> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1)?,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => total,
    };
    (start <= end && end <= total).then_some(start..end)
}

/// `range` as Rust writes it (`4..=9`, `..`), for messages.
pub(crate) fn describe(range: &impl RangeBounds<usize>) -> String {
    let start = match range.start_bound() {
        Bound::Included(s) => s.to_string(),
        Bound::Excluded(s) => format!("(after {s})"),
        Bound::Unbounded => String::new(),
    };
    match range.end_bound() {
        Bound::Included(e) => format!("{start}..={e}"),
        Bound::Excluded(e) => format!("{start}..{e}"),
        Bound::Unbounded => format!("{start}.."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Offsets and lengths where arithmetic breaks: 0, 1, and the top of `usize`.
    fn edge() -> impl Strategy<Value = usize> {
        prop_oneof![
            Just(0usize),
            Just(1),
            Just(usize::MAX),
            Just(usize::MAX - 1),
            (usize::MAX - 64..=usize::MAX),
            0usize..=4096,
            any::<usize>(),
        ]
    }

    proptest! {
        #[test]
        fn fits_never_wraps(off in edge(), len in edge(), total in edge()) {
            let want = (off as u128 + len as u128) <= total as u128;
            prop_assert_eq!(fits(off, len, total), want);
        }

        #[test]
        fn resolve_matches_wide_arithmetic(a in edge(), b in edge(), total in edge()) {
            let check = |r: Option<Range<usize>>, s: u128, e: u128| {
                let ok = s <= e && e <= total as u128;
                prop_assert_eq!(r.clone().is_some(), ok);
                if let Some(r) = r {
                    prop_assert_eq!((r.start as u128, r.end as u128), (s, e));
                }
                Ok(())
            };
            let (wa, wb) = (a as u128, b as u128);
            check(resolve(&(a..b), total), wa, wb)?;
            check(resolve(&(a..=b), total), wa, wb + 1)?;
            check(resolve(&(..=b), total), 0, wb + 1)?;
            check(resolve(&(a..), total), wa, total as u128)?;
            check(resolve(&(Bound::Excluded(a), Bound::Excluded(b)), total), wa + 1, wb)?;
        }
    }

    #[test]
    #[allow(clippy::reversed_empty_ranges)] // an inverted range is one of the edges
    fn edges() {
        assert_eq!(resolve(&(..=usize::MAX), usize::MAX), None);
        assert_eq!(resolve(&(..), 0), Some(0..0));
        assert_eq!(resolve(&(5..5), 5), Some(5..5));
        assert_eq!(resolve(&(6..5), 10), None, "inverted");
        assert!(!fits(usize::MAX, 1, usize::MAX));
        assert!(fits(usize::MAX, 0, usize::MAX));
        assert_eq!(describe(&(4..=9)), "4..=9");
        assert_eq!(describe(&(..)), "..");
    }
}

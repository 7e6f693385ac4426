//! Checks of the arguments C passes: pointers (NULL, alignment), strings (bounded, UTF-8),
//! arrays (NULL with a non-zero count, counts bounded), and the out-parameters results go to.

use crate::status::{Fail, Res, GDASYNC_ERR_NULL, GDASYNC_ERR_SIZE};
use std::ffi::c_char;

/// Longest string argument read (device names, endpoints): longer ones are refused, and a
/// string missing its terminator is not read past this.
pub(crate) const MAX_STRING: usize = 4096;

/// Refuses NULL and misaligned pointers to a `T`.
pub(crate) fn check_ptr<T>(p: *const T, what: &str) -> Res<()> {
    if p.is_null() {
        return Err(Fail::new(GDASYNC_ERR_NULL, format!("{what} is NULL")));
    }
    if (p as usize) % std::mem::align_of::<T>() != 0 {
        return Err(Fail::invalid(format!(
            "{what} is not aligned for its type ({} bytes)",
            std::mem::align_of::<T>()
        )));
    }
    Ok(())
}

/// The string at `p`: NUL-terminated within [`MAX_STRING`] bytes, UTF-8.
pub(crate) fn string<'a>(p: *const c_char, what: &str) -> Res<&'a str> {
    check_ptr(p, what)?;
    // SAFETY: `p` is not NULL; strnlen reads at most MAX_STRING bytes of the caller's string,
    // which the header requires to be NUL-terminated.
    let n = unsafe { libc::strnlen(p, MAX_STRING) };
    if n == MAX_STRING {
        return Err(Fail::new(
            GDASYNC_ERR_SIZE,
            format!("{what} is longer than {MAX_STRING} bytes (or not NUL-terminated)"),
        ));
    }
    // SAFETY: the n bytes before the terminator were just read by strnlen.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) };
    std::str::from_utf8(bytes).map_err(|_| Fail::invalid(format!("{what} is not UTF-8")))
}

/// The optional string at `p` (`None` for NULL).
pub(crate) fn opt_string<'a>(p: *const c_char, what: &str) -> Res<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    string(p, what).map(Some)
}

/// The `n` items at `p`; NULL only with `n` = 0; at most `max` of them.
pub(crate) fn array<'a, T>(p: *const T, n: usize, max: usize, what: &str) -> Res<&'a [T]> {
    if n > max {
        return Err(Fail::invalid(format!("{n} items in {what}: at most {max}")));
    }
    if n == 0 {
        return Ok(&[]);
    }
    check_ptr(p, what)?;
    // SAFETY: checked non-NULL and aligned; the header requires `n` valid items at `p`.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// The `T` at `p`, read by value.
pub(crate) fn read<T: Copy>(p: *const T, what: &str) -> Res<T> {
    check_ptr(p, what)?;
    // SAFETY: checked non-NULL and aligned; the header requires a valid `T` at `p`.
    Ok(unsafe { p.read() })
}

/// Stores `v` at the out-parameter `p`.
pub(crate) fn write<T>(p: *mut T, v: T, what: &str) -> Res<()> {
    check_ptr(p, what)?;
    // SAFETY: checked non-NULL and aligned; the header requires room for a `T` at `p`.
    unsafe { p.write(v) };
    Ok(())
}

/// Stores `v` at `p` unless `p` is NULL (an optional out-parameter).
pub(crate) fn write_opt<T>(p: *mut T, v: T, what: &str) -> Res<()> {
    if p.is_null() {
        return Ok(());
    }
    write(p, v, what)
}

/// Copies `s` and a NUL into the caller's `buf` of `len` bytes; too small a buffer is
/// refused with the size it needs.
pub(crate) fn copy_string(s: &str, buf: *mut c_char, len: usize, what: &str) -> Res<()> {
    if s.len() + 1 > len {
        return Err(Fail::new(
            GDASYNC_ERR_SIZE,
            format!(
                "{what} needs {} bytes (with its NUL); the buffer has {len}",
                s.len() + 1
            ),
        ));
    }
    check_ptr(buf, what)?;
    // SAFETY: `buf` is not NULL and the caller gives `len` writable bytes, more than s + NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// Stores `items` at `p`, which has room for `room` of them (NULL only with `room` = 0, at
/// most `max`); returns how many were stored. Written through the pointer, never read: the
/// caller's items may be uninitialised.
pub(crate) fn fill<T>(
    p: *mut T,
    room: usize,
    max: usize,
    items: impl IntoIterator<Item = T>,
    what: &str,
) -> Res<usize> {
    if room > max {
        return Err(Fail::invalid(format!(
            "room for {room} items in {what}: at most {max}"
        )));
    }
    if room > 0 {
        check_ptr(p, what)?;
    }
    let mut n = 0;
    for item in items.into_iter().take(room) {
        // SAFETY: checked non-NULL and aligned; the header requires room for `room` items
        // at `p`, and n < room.
        unsafe { p.add(n).write(item) };
        n += 1;
    }
    Ok(n)
}

/// The 32-bit word at `p`, which others (the NIC, another thread) may change while it is read.
pub(crate) fn word32<'a>(p: *mut u32, what: &str) -> Res<&'a std::sync::atomic::AtomicU32> {
    check_ptr(p, what)?;
    // SAFETY: checked non-NULL and aligned; the header requires a live word that others
    // change only by aligned 32-bit stores.
    Ok(unsafe { std::sync::atomic::AtomicU32::from_ptr(p) })
}

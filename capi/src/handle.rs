//! Handles: what C holds is an opaque pointer that encodes a slot of one table, the type of
//! the object and the slot's generation. The library never dereferences it: a destroyed
//! handle (its generation moved on), a handle of another type, or a pointer the library never
//! made is refused with `GDASYNC_ERR_HANDLE`, never undefined behaviour.

use crate::status::{Fail, Res, GDASYNC_ERR_HANDLE, GDASYNC_ERR_NULL};

// A handle carries a 32-bit generation above its type and slot: it needs 64-bit pointers.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("the C ABI's handles need 64-bit pointers");
use parking_lot::Mutex;
use std::any::Any;

/// Most live handles of all types together.
const MAX_SLOTS: usize = 1 << 24;

/// An object C holds a handle to; `Obj` is cheap to clone (an `Arc` or a handle type of
/// gdsync), so calls use a copy and never hold the table's lock while they work.
pub(crate) trait Handle {
    /// The object behind the handle.
    type Obj: Clone + Send + 'static;
    /// The type's tag in the handle (1..=255, one per type).
    const TAG: u8;
    /// What the header calls it, for messages.
    const NAME: &'static str;
}

/// An object of any handle type; the slot's tag says which.
type Object = Box<dyn Any + Send>;

struct Slot {
    generation: u32,
    obj: Option<(u8, Object)>,
}

struct Table {
    slots: Vec<Slot>,
    free: Vec<usize>,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    slots: Vec::new(),
    free: Vec::new(),
});

/// The handle's bits: generation (32) | tag (8) | slot + 1 (24). Never 0.
fn encode(slot: usize, tag: u8, generation: u32) -> usize {
    ((generation as usize) << 32) | ((tag as usize) << 24) | (slot + 1)
}

/// The slot, tag and generation a handle names (`None`: NULL).
fn decode(h: usize) -> Option<(usize, u8, u32)> {
    let slot = h & 0xff_ffff;
    (slot != 0).then(|| (slot - 1, (h >> 24) as u8, (h >> 32) as u32))
}

/// Puts `obj` in the table and returns its new handle.
pub(crate) fn insert<H: Handle>(obj: H::Obj) -> Res<*mut H> {
    let mut t = TABLE.lock();
    let slot = match t.free.pop() {
        Some(s) => s,
        None if t.slots.len() < MAX_SLOTS => {
            t.slots.push(Slot {
                generation: 0,
                obj: None,
            });
            t.slots.len() - 1
        }
        None => {
            return Err(Fail::new(
                crate::status::GDASYNC_ERR_AGAIN,
                format!("{MAX_SLOTS} handles are live: destroy some first"),
            ))
        }
    };
    let s = &mut t.slots[slot];
    s.generation = s.generation.wrapping_add(1).max(1);
    s.obj = Some((H::TAG, Box::new(obj)));
    Ok(encode(slot, H::TAG, s.generation) as *mut H)
}

/// Why `h` names no live `H`.
fn refused<H: Handle>(h: usize, what: &str) -> Fail {
    if h == 0 {
        return Fail::new(GDASYNC_ERR_NULL, format!("{what} ({}) is NULL", H::NAME));
    }
    Fail::new(
        GDASYNC_ERR_HANDLE,
        format!(
            "{what} is not a live {}: it was destroyed already, is another type's handle, or was not made by gdasync",
            H::NAME
        ),
    )
}

/// Runs `f` on the slot `h` names if it holds a live `H`.
fn with_slot<H: Handle, R>(h: *mut H, what: &str, f: impl FnOnce(&mut Slot) -> R) -> Res<R> {
    let bits = h as usize;
    let mut t = TABLE.lock();
    if let Some((slot, tag, generation)) = decode(bits) {
        if let Some(s) = t.slots.get_mut(slot) {
            let live = matches!(&s.obj, Some((tg, _)) if *tg == H::TAG);
            if live && tag == H::TAG && s.generation == generation {
                return Ok(f(s));
            }
        }
    }
    Err(refused::<H>(bits, what))
}

/// A copy of the object `h` names; `what` names the argument in the message.
pub(crate) fn get<H: Handle>(h: *mut H, what: &str) -> Res<H::Obj> {
    with_slot(h, what, |s| {
        let (_, o) = s.obj.as_ref().expect("a live slot holds an object");
        o.downcast_ref::<H::Obj>()
            .expect("the tag says the type")
            .clone()
    })
}

/// Takes the object `h` names out of the table: `h` is dead from here on.
pub(crate) fn remove<H: Handle>(h: *mut H, what: &str) -> Res<H::Obj> {
    let (slot, obj) = with_slot(h, what, |s| {
        let (_, o) = s.obj.take().expect("a live slot holds an object");
        (decode(h as usize).map(|d| d.0), o)
    })?;
    if let Some(slot) = slot {
        TABLE.lock().free.push(slot);
    }
    Ok(*obj.downcast::<H::Obj>().expect("the tag says the type"))
}

/// Ties a C handle type (an opaque struct declared where cbindgen sees it) to its tag and the
/// object it names.
macro_rules! handle_impl {
    ($c:ident, $tag:literal, $obj:ty) => {
        impl $crate::handle::Handle for $c {
            type Obj = $obj;
            const TAG: u8 = $tag;
            const NAME: &'static str = stringify!($c);
        }
    };
}
pub(crate) use handle_impl;

//! Strict checks of the send side: what a ConnectX leaves undefined becomes a QP error, with
//! one log line and an async event, instead of a guess (`docs/soft-device.md`, "Strict
//! checks: what a ConnectX leaves undefined"): a doorbell whose WQE index goes backwards or
//! past the doorbell record, a doorbell record ahead of WQEs not yet written (the WQE there
//! does not carry the expected index), a WQE whose ds count disagrees with its segments or
//! exceeds the largest WQE the device reports.

use super::{Engine, QpHw};
use crate::format::*;

/// Why strict checks refuse: a ConnectX leaves it undefined.
const UNDEFINED: &str = "a ConnectX leaves this undefined";

/// Checks every half of the doorbell register that changed since `last` and names a WQE of
/// this QP (a doorbell without one, e.g. a proxy's, says nothing to check): where its WQEs
/// end must not lie behind `rung_end` (where the newest doorbell rung before ended), nor
/// past the doorbell record (every ringer stores the record first). Returns where the newest
/// doorbell ends now, or what is wrong.
pub(super) fn check_doorbell(
    hw: &QpHw,
    db: super::Doorbell,
    last: super::Doorbell,
    rung_end: u16,
) -> Result<u16, String> {
    let mut newest = rung_end;
    let mut record = None;
    for h in 0..db.len() {
        if db[h] == last[h] {
            continue;
        }
        let Some(end) = doorbell_end(db[h], hw.qpn) else {
            continue;
        };
        if (end.wrapping_sub(rung_end) as i16) < 0 {
            return Err(format!(
                "a doorbell for the WQEs up to index {end} came after one up to {rung_end}: the doorbell went backwards (two ringers of the QP out of order?); {UNDEFINED}"
            ));
        }
        // (The record is read after the doorbell: a record stored before it is seen.)
        let rec = *record.get_or_insert_with(|| hw.sq_producer());
        if (end.wrapping_sub(rec) as i16) > 0 {
            return Err(format!(
                "a doorbell for the WQEs up to index {end} is past the doorbell record ({rec}): the record must be stored before the doorbell; {UNDEFINED}"
            ));
        }
        if (end.wrapping_sub(newest) as i16) > 0 {
            newest = end;
        }
    }
    Ok(newest)
}

/// What is wrong with the control segment at send consumer index `sq_ci` when the doorbell
/// exposes `avail` blocks, if anything: the index, the QPN, a size within what is exposed
/// and the largest WQE the device reports (as [`MAX_WQE_WQEBBS`]).
pub(super) fn ctrl_complaint(hw: &QpHw, ctrl: &CtrlSeg, sq_ci: u64, avail: u32) -> Option<String> {
    let ds = ctrl.ds() as usize;
    let nbb = wqebbs_for_ds(ds);
    let at = sq_ci as u16;
    Some(if ctrl.wqe_index() != at {
        format!(
            "the WQE at index {at} carries index {}: the doorbell record (or doorbell) exposes a slot not written yet (a stale WQE of the ring's previous lap?); {UNDEFINED}",
            ctrl.wqe_index()
        )
    } else if ctrl.qpn() != hw.qpn {
        format!("the WQE at index {at} names QP {:#x}", ctrl.qpn())
    } else if ds == 0 {
        format!("the WQE at index {at} has a ds count of 0")
    } else if nbb > MAX_WQE_WQEBBS {
        format!(
            "the WQE at index {at} has {ds} DS ({nbb} blocks): the device takes WQEs of at most {MAX_WQE_WQEBBS} blocks"
        )
    } else if nbb > avail as usize {
        format!("the WQE at index {at} has {ds} DS ({nbb} blocks) but the doorbell exposes {avail}")
    } else {
        return None;
    })
}

/// Whether the ds count of a WQE whose inline payload of `len` bytes starts at byte `at`
/// (after its 4-byte header) is what its segments take: the payload ends in the last unit.
/// More units (or fewer) disagree with the segments.
#[inline]
pub(super) fn inline_ds_agrees(ds: u8, at: usize, len: usize) -> bool {
    (at + len).div_ceil(SEG_SIZE) == ds as usize
}

impl Engine {
    /// The QP's doorbell or WQE is refused (`why`, e.g. a strict check): one log line, then
    /// the QP fails as for a malformed WQE (an error completion with LOCAL_QP_OP, the QP to
    /// error, the async event QP fatal). `ctrl`, `sq_ci` and `pi` as
    /// [`malformed`](Self::malformed).
    pub(super) fn refuse(
        &mut self,
        qpn: u32,
        ctrl: Option<&CtrlSeg>,
        sq_ci: u64,
        pi: u16,
        why: &str,
    ) {
        tracing::warn!(
            "soft device: QP {qpn:#x}: {why}; the QP goes to the error state (LOCAL_QP_OP)"
        );
        self.malformed(qpn, ctrl, sq_ci, pi);
    }
}

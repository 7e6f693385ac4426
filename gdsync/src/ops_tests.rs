//! Op lists: how `append` merges doorbells and keeps deferred retirement stores last.

use super::*;

fn w32(addr: u64, value: u32) -> Op {
    Op::Write32 { addr, value }
}

fn wait(addr: u64) -> Op {
    Op::Wait32 {
        addr,
        value: 1,
        cond: WaitCond::Geq,
    }
}

fn list(ops: &[Op]) -> Ops {
    // SAFETY: the lists are compared, never run.
    unsafe { ops_of(ops) }
}

/// A completion wait as the library builds one: the wait, then `retire` stores that retire it.
fn completion_wait(retire: &[Op]) -> Ops {
    let mut l = list(&[wait(0x100)]);
    let keep: KeepAlive = Arc::new(());
    for &op in retire {
        l.push_retire(op, &keep);
    }
    l
}

#[test]
fn appended_work_goes_before_a_late_retirement() {
    let ci = w32(0x200, 5);
    let mut l = completion_wait(&[ci]).retire_late();
    assert_eq!(l.deferred_len(), 1);
    l.append(list(&[w32(0x300, 1)]));
    l.append(list(&[w32(0x400, 2), w32(0x500, 3)]));
    assert_eq!(
        l.as_slice(),
        &[wait(0x100), w32(0x300, 1), w32(0x400, 2), w32(0x500, 3), ci]
    );
    assert_eq!(l.deferred_len(), 1);
}

#[test]
fn a_wait_appended_runs_after_every_retirement_held_back() {
    let ci = w32(0x200, 5);
    let mut l = completion_wait(&[ci]).retire_late();
    l.append(list(&[w32(0x300, 1)]));
    l.append(list(&[wait(0x600), w32(0x700, 1)]));
    assert_eq!(
        l.as_slice(),
        &[wait(0x100), w32(0x300, 1), ci, wait(0x600), w32(0x700, 1)]
    );
    assert_eq!(l.deferred_len(), 0);
}

#[test]
fn two_late_retirements_keep_their_order_at_the_end() {
    let (ci, retired) = (w32(0x200, 5), w32(0x210, 9));
    let mut l = completion_wait(&[ci, retired]).retire_late();
    assert_eq!(l.deferred_len(), 2);
    // A second wait's late retirement, appended after work: the first's must run before the
    // second's wait, and the second's goes last.
    let ci2 = w32(0x220, 6);
    l.append(list(&[w32(0x300, 1)]));
    l.append(completion_wait(&[ci2]).retire_late());
    l.append(list(&[w32(0x400, 2)]));
    assert_eq!(
        l.as_slice(),
        &[
            wait(0x100),
            w32(0x300, 1),
            ci,
            retired,
            wait(0x100),
            w32(0x400, 2),
            ci2
        ]
    );
}

#[test]
fn retire_now_ends_the_deferral() {
    let ci = w32(0x200, 5);
    let mut l = completion_wait(&[ci]).retire_late();
    l.append(list(&[w32(0x300, 1)]));
    l.retire_now();
    assert_eq!(l.deferred_len(), 0);
    l.append(list(&[w32(0x400, 2)]));
    assert_eq!(
        l.as_slice(),
        &[wait(0x100), w32(0x300, 1), ci, w32(0x400, 2)]
    );
}

#[test]
fn without_retire_late_the_order_is_as_written() {
    let ci = w32(0x200, 5);
    let mut l = completion_wait(&[ci]);
    assert_eq!(l.deferred_len(), 0);
    l.append(list(&[w32(0x300, 1)]));
    assert_eq!(l.as_slice(), &[wait(0x100), ci, w32(0x300, 1)]);
    // Lists without retirement stores have nothing to defer.
    let plain = list(&[w32(0x300, 1)]).retire_late();
    assert_eq!(plain.deferred_len(), 0);
}

#[test]
fn a_push_after_a_late_retirement_goes_after_it() {
    let ci = w32(0x200, 5);
    let mut l = completion_wait(&[ci]).retire_late();
    // SAFETY: the list is compared, never run.
    unsafe { l.push_raw(w32(0x300, 1)) };
    assert_eq!(l.deferred_len(), 0);
    l.append(list(&[w32(0x400, 2)]));
    assert_eq!(
        l.as_slice(),
        &[wait(0x100), ci, w32(0x300, 1), w32(0x400, 2)]
    );
}

#[test]
fn rings_of_one_queue_merge_across_a_late_retirement() {
    let (dbrec, db) = (0x800, 0x900);
    let ring = |v: u32| {
        let mut r = list(&[
            w32(dbrec, v),
            Op::Doorbell {
                addr: db,
                value: v.into(),
            },
        ]);
        r.mark_ring(dbrec);
        r
    };
    let ci = w32(0x200, 5);
    let mut l = completion_wait(&[ci]).retire_late();
    l.append(ring(1));
    l.append(ring(2));
    assert_eq!(
        l.as_slice(),
        &[
            wait(0x100),
            w32(dbrec, 2),
            Op::Doorbell { addr: db, value: 2 },
            ci
        ]
    );
    // After a wait the stores follow the ring: no merge across them.
    let mut l = ring(1);
    l.append(completion_wait(&[ci]).retire_late());
    l.append(list(&[wait(0x600)]));
    l.append(ring(2));
    assert_eq!(l.len(), 7);
}

//! gdsync's soft HCA as a shared library (`libgdasync_emulated_hca.so`), so that any program
//! linked with libibverbs, run under `scripts/with-emulated-hca`, has its work executed with
//! no call of its own.
//!
//! How it works: `with-emulated-hca` puts the emulated driver (uverbs-emu's preload,
//! `c/uvemu.c`) in the program's `LD_PRELOAD` and this library's path in `$UVEMU_HCA`. The
//! first time the program opens a `/dev/infiniband/uverbsN` of the emulator (libibverbs'
//! `ibv_open_device`), the driver, finding no HCA attached yet, `dlopen`s this library and calls
//! [`gdasync_emulated_hca_attach`], which is `gdsync::mlx5::serve_emulated_driver()`: one soft
//! device per emulated device, attached as the driver's HCA and published on the emulators'
//! fabric, as a gdasync process does for itself. Programs that never open a uverbs device
//! (shells, `timeout`) never load it. gdasync's own processes attach their soft HCA before
//! they open a device, so the driver does not load this one there; one that opens a device
//! first finds this HCA attached and does not attach another (no double attachment).

use std::ffi::c_int;

/// Attaches this library's soft HCA to the emulated driver the process runs under: 0, or an
/// errno (`ENODEV`: not under the driver or it refused; the reason goes to stderr).
#[no_mangle]
pub extern "C" fn gdasync_emulated_hca_attach() -> c_int {
    match std::panic::catch_unwind(gdsync::mlx5::serve_emulated_driver) {
        Ok(Ok(_)) => 0,
        Ok(Err(why)) => {
            eprintln!("gdasync emulated HCA: {why}");
            libc::ENODEV
        }
        Err(_) => {
            eprintln!("gdasync emulated HCA: attaching panicked");
            libc::ENODEV
        }
    }
}

/// Lends the calling thread to this library's soft HCA: runs its pending rounds where the soft
/// engines progress on shared threads (machines with fewer cores than engines and polling
/// threads), as a software RDMA provider runs its data path on the threads that post and
/// poll. The emulated driver calls it from the `post_send`, `post_recv` and `poll_cq` of the
/// contexts a program opens, so a verbs program lends its threads without knowing it.
#[no_mangle]
pub extern "C" fn gdasync_emulated_hca_progress() {
    // (A panic must not cross into C: it is dropped, and the engine threads serve instead.)
    let _ = std::panic::catch_unwind(gdsync::lend_thread);
}

/// How many RDMA writes without immediate this library's soft HCA has taken in as responder
/// (the requests that land without a completion to poll for): the emulated driver's `poll_cq`
/// reads it while lending its thread, to tell whether a peer's write landed meanwhile.
#[no_mangle]
pub extern "C" fn gdasync_emulated_hca_writes_taken_in() -> u64 {
    gdsync::soft_writes_taken_in()
}

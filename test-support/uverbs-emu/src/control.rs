//! Test controls of the emulated driver serving this process: events a HCA raises on its own
//! (a link going down or up, a QP failing fatally, a CQ error), asked for from the process
//! itself, and the count of the commands the driver served by kind. They
//! reach the preload library through `dlsym`, so they work only in a process started under
//! an [`Emulator`](crate::Emulator); elsewhere they say so.

use std::ffi::{c_char, c_int, CString};

/// The preload's control function `name`, or why it is not there.
fn control<F: Copy>(name: &std::ffi::CStr) -> Result<F, String> {
    // SAFETY: dlsym with a NUL-terminated name, searching the loaded objects.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if f.is_null() {
        return Err(format!(
            "{}: this process is not running under the emulated RDMA driver",
            name.to_string_lossy()
        ));
    }
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of_val(&f));
    // SAFETY: `F` is the function-pointer type uvemu.h declares for `name`.
    Ok(unsafe { std::mem::transmute_copy(&f) })
}

/// An errno the preload returned, as an error.
fn check(what: &str, rc: c_int) -> Result<(), String> {
    match rc {
        0 => Ok(()),
        e => Err(format!("{what}: {}", std::io::Error::from_raw_os_error(e))),
    }
}

/// Sets `port` (from 1) of device `device` active or down, as the link coming up or going
/// down would: the driver then reports the new state, and every open context of the device
/// gets the async event (port active, port error).
pub fn set_port_state(device: &str, port: u8, active: bool) -> Result<(), String> {
    type SetPortState = unsafe extern "C" fn(*const c_char, c_int, c_int) -> c_int;
    let f: SetPortState = control(c"uvemu_set_port_state")?;
    let name = CString::new(device).map_err(|_| format!("{device:?}: not a device name"))?;
    // SAFETY: the function uvemu.h declares, with a NUL-terminated name that outlives it.
    let rc = unsafe { f(name.as_ptr(), port.into(), active.into()) };
    check(&format!("{device} port {port}"), rc)
}

/// Moves QP `qpn` to the error state and raises the QP-fatal async event on its context, as a
/// HCA does for an error it cannot report in a completion.
pub fn qp_fatal(qpn: u32) -> Result<(), String> {
    type QpFatal = unsafe extern "C" fn(u32) -> c_int;
    let f: QpFatal = control(c"uvemu_qp_fatal")?;
    // SAFETY: the function uvemu.h declares.
    check(&format!("QP {qpn:#x}"), unsafe { f(qpn) })
}

/// Raises the CQ-error async event (`IBV_EVENT_CQ_ERR`) about CQ `cqn` on its context, as a
/// HCA does when a CQ overruns. Only the event: the soft HCA serving the data path goes on.
pub fn cq_error(cqn: u32) -> Result<(), String> {
    type CqError = unsafe extern "C" fn(u32) -> c_int;
    let f: CqError = control(c"uvemu_cq_error")?;
    // SAFETY: the function uvemu.c declares for tests.
    check(&format!("CQ {cqn:#x}"), unsafe { f(cqn) })
}

/// A kind of command the driver serves. On a ConnectX the kernel driver turns each into a
/// firmware command (serialised on the device's command interface, tens of microseconds):
/// none belongs in a data path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Command {
    /// `ibv_open_device` (the context).
    GetContext = 0,
    /// `ibv_query_port`.
    QueryPort = 2,
    /// `ibv_alloc_pd`.
    AllocPd = 3,
    /// `ibv_dealloc_pd`.
    DeallocPd = 4,
    /// `ibv_reg_mr`.
    RegMr = 9,
    /// `ibv_dereg_mr`.
    DeregMr = 13,
    /// `ibv_create_cq`.
    CreateCq = 18,
    /// `ibv_destroy_cq`.
    DestroyCq = 20,
    /// `ibv_create_qp`.
    CreateQp = 24,
    /// `ibv_query_qp` (firmware QUERY_QP).
    QueryQp = 25,
    /// `ibv_modify_qp` (firmware RST2INIT, INIT2RTR, RTR2RTS, 2ERR...).
    ModifyQp = 26,
    /// `ibv_destroy_qp`.
    DestroyQp = 27,
}

/// How many commands of kind `c` the driver has served this process so far (all its
/// contexts). (The numbers are `ib_user_verbs.h`'s `IB_USER_VERBS_CMD_*`.)
pub fn command_count(c: Command) -> Result<u64, String> {
    type Count = unsafe extern "C" fn(u32, *mut u64) -> c_int;
    let f: Count = control(c"uvemu_command_count")?;
    let mut n = 0u64;
    // SAFETY: the function uvemu.c declares for tests, with a pointer to a live u64.
    check(&format!("{c:?}"), unsafe { f(c as u32, &mut n) })?;
    Ok(n)
}

/// How many commands of kind `c` the driver served through their native ioctl methods
/// (`UVERBS_METHOD_CQ_CREATE` for `CreateCq`...), the ones libibverbs tries first on a current
/// kernel: none of these fell back to `INVOKE_WRITE` or `write()`.
pub fn native_command_count(c: Command) -> Result<u64, String> {
    type Count = unsafe extern "C" fn(u32, *mut u64) -> c_int;
    let f: Count = control(c"uvemu_native_command_count")?;
    let mut n = 0u64;
    // SAFETY: the function uvemu.c declares for tests, with a pointer to a live u64.
    check(&format!("{c:?}"), unsafe { f(c as u32, &mut n) })?;
    Ok(n)
}

/// How many commands of kind `c` reached the driver through the ioctl ABI
/// (`UVERBS_METHOD_INVOKE_WRITE`) rather than `write()`: tells which ABI libibverbs took.
pub fn ioctl_command_count(c: Command) -> Result<u64, String> {
    type Count = unsafe extern "C" fn(u32, *mut u64) -> c_int;
    let f: Count = control(c"uvemu_ioctl_command_count")?;
    let mut n = 0u64;
    // SAFETY: the function uvemu.c declares for tests, with a pointer to a live u64.
    check(&format!("{c:?}"), unsafe { f(c as u32, &mut n) })?;
    Ok(n)
}

/// The dynamic UARs (`MLX5_IB_OBJECT_UAR`) this process's contexts allocated, and the QPs
/// created on one, since the process started: a current libmlx5 on the ioctl ABI puts every
/// QP on one; on the legacy ABI there are none.
pub fn dyn_uar_count() -> Result<(u64, u64), String> {
    type Count = unsafe extern "C" fn(*mut u64, *mut u64) -> c_int;
    let f: Count = control(c"uvemu_dyn_uar_count")?;
    let (mut uars, mut qps) = (0u64, 0u64);
    // SAFETY: the function uvemu.c declares for tests, with pointers to live u64s.
    check("dynamic UARs", unsafe { f(&mut uars, &mut qps) })?;
    Ok((uars, qps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_the_emulator_the_controls_say_so() {
        let e = qp_fatal(1).unwrap_err();
        assert!(
            e.contains("not running under the emulated RDMA driver"),
            "{e}"
        );
        assert!(set_port_state("mlx5_0", 1, false).is_err());
        assert!(cq_error(0x400).is_err());
        assert!(command_count(Command::QueryQp).is_err());
        assert!(ioctl_command_count(Command::AllocPd).is_err());
    }
}

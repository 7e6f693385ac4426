//! Test controls of the emulated driver serving this process: events a HCA raises on its own
//! (a link going down or up, a QP failing fatally), asked for from the process itself. They
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
    }
}

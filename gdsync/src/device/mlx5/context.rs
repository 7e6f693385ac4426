//! RDMA devices and an open device context: the device list, `ibv_open_device`,
//! `ibv_query_device` (limits), `ibv_query_port` and the GID table.

use super::error::RdmaError;
use super::gid::{choose_gid, Gid, GidChoice, GidEntry, GidType};
use super::loader::Rdma;
use super::port::{PortInfo, PortState};
use super::{sys, RdmaResult};
use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

/// An RDMA device as the device list shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaDeviceInfo {
    /// Its name (`mlx5_0`).
    pub name: String,
    /// Its uverbs node (`uverbs0`).
    pub uverbs: String,
    /// Node GUID, as printed (`0c42:a103:00aa:bb01`).
    pub node_guid: String,
    /// Whether libmlx5 drives it (direct verbs supported).
    pub mlx5: bool,
}

/// The device list (`ibv_get_device_list`), freed on drop.
struct DeviceList {
    rdma: &'static Rdma,
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

impl DeviceList {
    fn get(rdma: &'static Rdma) -> RdmaResult<Self> {
        let mut n = 0;
        // SAFETY: FFI; `n` outlives the call.
        let list = unsafe { rdma.verbs.ibv_get_device_list(&mut n) };
        match NonNull::new(list) {
            Some(list) => Ok(DeviceList {
                rdma,
                list,
                len: n.max(0) as usize,
            }),
            None => Err(no_rdma_subsystem(RdmaError::last("ibv_get_device_list"))),
        }
    }

    fn devices(&self) -> impl Iterator<Item = NonNull<sys::ibv_device>> + '_ {
        // SAFETY: the list holds `len` non-null device pointers while it lives.
        (0..self.len).filter_map(|i| NonNull::new(unsafe { *self.list.as_ptr().add(i) }))
    }

    fn info(&self, dev: NonNull<sys::ibv_device>) -> RdmaDeviceInfo {
        let v = &self.rdma.verbs;
        // SAFETY: `dev` is an entry of the live list; the strings it holds are NUL-terminated
        // arrays inside the device struct.
        unsafe {
            let name = CStr::from_ptr(v.ibv_get_device_name(dev.as_ptr()));
            let uverbs = CStr::from_ptr((*dev.as_ptr()).dev_name.as_ptr());
            let guid = u64::from_be(v.ibv_get_device_guid(dev.as_ptr()));
            RdmaDeviceInfo {
                name: name.to_string_lossy().into_owned(),
                uverbs: uverbs.to_string_lossy().into_owned(),
                node_guid: guid_text(guid),
                mlx5: self.rdma.mlx5.mlx5dv_is_supported(dev.as_ptr()),
            }
        }
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { self.rdma.verbs.ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// `ibv_get_device_list` fails with ENOSYS where the kernel has no RDMA subsystem.
fn no_rdma_subsystem(e: RdmaError) -> RdmaError {
    match e {
        RdmaError::Verbs { errno, .. } if errno == libc::ENOSYS => RdmaError::NoDevice(
            "the kernel has no RDMA subsystem (no RDMA netlink, no /sys/class/infiniband_verbs)"
                .into(),
        ),
        e => e,
    }
}

/// `0c42:a103:00aa:bb01`, as sysfs and ibv_devinfo print a GUID.
fn guid_text(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        g >> 48,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

/// The RDMA devices present (an empty list where rdma-core finds none).
pub fn devices() -> RdmaResult<Vec<RdmaDeviceInfo>> {
    let list = DeviceList::get(Rdma::get()?)?;
    Ok(list.devices().map(|d| list.info(d)).collect())
}

/// Device-wide limits and identity (`ibv_device_attr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Firmware version.
    pub fw_ver: String,
    /// Node GUID, as printed.
    pub node_guid: String,
    /// System image GUID, as printed.
    pub sys_image_guid: String,
    /// IEEE vendor id (0x02c9 = Mellanox).
    pub vendor_id: u32,
    /// Vendor part id (4125 = ConnectX-6 Dx).
    pub vendor_part_id: u32,
    /// Hardware revision.
    pub hw_ver: u32,
    /// Largest region to register, in bytes.
    pub max_mr_size: u64,
    /// Most QPs.
    pub max_qp: u32,
    /// Most work requests in one queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather entries in one work request.
    pub max_sge: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Most entries in one CQ.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most outstanding RDMA reads and atomics a QP may be the target of.
    pub max_qp_rd_atom: u32,
    /// Most outstanding RDMA reads and atomics a QP may start.
    pub max_qp_init_rd_atom: u32,
    /// Atomic support (`atomic_cap`: 0 none, 1 within the HCA, 2 global).
    pub atomic_cap: u32,
    /// Number of ports.
    pub phys_port_cnt: u8,
}

/// A non-negative `int` limit as the unsigned count it is.
fn count(v: i32) -> u32 {
    v.max(0) as u32
}

impl DeviceLimits {
    fn from_raw(a: &sys::ibv_device_attr) -> Self {
        // SAFETY: fw_ver is a NUL-terminated array (zeroed before the call, filled by it).
        let fw = unsafe { CStr::from_ptr(a.fw_ver.as_ptr()) };
        DeviceLimits {
            fw_ver: fw.to_string_lossy().into_owned(),
            node_guid: guid_text(u64::from_be(a.node_guid)),
            sys_image_guid: guid_text(u64::from_be(a.sys_image_guid)),
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_mr_size: a.max_mr_size,
            max_qp: count(a.max_qp),
            max_qp_wr: count(a.max_qp_wr),
            max_sge: count(a.max_sge),
            max_cq: count(a.max_cq),
            max_cqe: count(a.max_cqe),
            max_mr: count(a.max_mr),
            max_pd: count(a.max_pd),
            max_qp_rd_atom: count(a.max_qp_rd_atom),
            max_qp_init_rd_atom: count(a.max_qp_init_rd_atom),
            atomic_cap: a.atomic_cap,
            phys_port_cnt: a.phys_port_cnt,
        }
    }
}

/// libmlx5's switch for WQE signatures: set (to anything), it makes QPs whose send WQEs the
/// HCA checks for a signature gdsync does not write, and whose receive WQEs start with a
/// signature segment where gdsync writes a scatter entry.
pub const QP_SIGNATURE_VAR: &str = "MLX5_QP_SIGNATURE";

/// Refuses to open `name` with [`QP_SIGNATURE_VAR`] set (`set`), as 128-byte CQEs are.
fn refuse_qp_signatures(name: &str, set: bool) -> RdmaResult<()> {
    if set {
        return Err(RdmaError::InvalidArgument(format!(
            "{name}: {QP_SIGNATURE_VAR} is set: libmlx5 would make QPs with WQE signatures, \
             which gdsync does not write; unset it"
        )));
    }
    Ok(())
}

/// An open RDMA device (`ibv_context`), closed when the last object made from it is gone.
pub struct Context {
    pub(crate) rdma: &'static Rdma,
    pub(crate) raw: NonNull<sys::ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread (the library locks what it shares);
// this type hands out no interior references.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name` (`mlx5_0`).
    pub fn open(name: &str) -> RdmaResult<Arc<Context>> {
        let rdma = Rdma::get()?;
        let list = DeviceList::get(rdma)?;
        let found = list.devices().find(|d| list.info(*d).name == name);
        let Some(dev) = found else {
            let names: Vec<String> = list.devices().map(|d| list.info(d).name).collect();
            return Err(RdmaError::UnknownDevice {
                name: name.into(),
                present: if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                },
            });
        };
        if !list.info(dev).mlx5 {
            return Err(RdmaError::InvalidArgument(format!(
                "{name} is not driven by libmlx5 (only mlx5 devices are supported)"
            )));
        }
        refuse_qp_signatures(name, std::env::var_os(QP_SIGNATURE_VAR).is_some())?;
        // SAFETY: `dev` is an entry of the live list; an opened device stays valid after the
        // list is freed (libibverbs holds a reference).
        let raw = unsafe { rdma.verbs.ibv_open_device(dev.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("ibv_open_device"))?;
        Ok(Arc::new(Context {
            rdma,
            raw,
            name: name.into(),
        }))
    }

    /// The first mlx5 device with an active port, and that port; or why there is none.
    pub fn open_first_active() -> RdmaResult<(Arc<Context>, u8)> {
        let mut seen = Vec::new();
        for dev in devices()?.into_iter().filter(|d| d.mlx5) {
            let ctx = Context::open(&dev.name)?;
            for port in 1..=ctx.query_device()?.phys_port_cnt {
                let p = ctx.query_port(port)?;
                if p.state == PortState::Active {
                    return Ok((ctx, port));
                }
                seen.push(format!("{}:{port} {}", dev.name, p.state));
            }
        }
        Err(RdmaError::NoDevice(if seen.is_empty() {
            "no mlx5 device found".into()
        } else {
            format!("no active mlx5 port ({})", seen.join(", "))
        }))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ibv_query_device`: limits and identity.
    pub fn query_device(&self) -> RdmaResult<DeviceLimits> {
        let mut a = sys::ibv_device_attr::default();
        // SAFETY: FFI on the open context; `a` outlives the call.
        let rc = unsafe { self.rdma.verbs.ibv_query_device(self.raw.as_ptr(), &mut a) };
        RdmaError::check("ibv_query_device", rc)?;
        Ok(DeviceLimits::from_raw(&a))
    }

    /// `ibv_query_port` (ports count from 1).
    pub fn query_port(&self, port: u8) -> RdmaResult<PortInfo> {
        let mut a = sys::ibv_port_attr::default();
        let ctx = self.raw.as_ptr();
        let rc = match self.verbs_context().and_then(|v| v.query_port) {
            // SAFETY: the provider's own query_port, given the size of the struct we pass
            // (what verbs.h's inline ibv_query_port does).
            Some(op) => unsafe { op(ctx, port, &mut a, std::mem::size_of_val(&a)) },
            // SAFETY: the exported compat entry fills the leading part of the struct (the
            // rest stays zeroed, as verbs.h's inline does).
            None => unsafe {
                self.rdma.verbs.ibv_query_port(
                    ctx,
                    port,
                    (&mut a as *mut sys::ibv_port_attr).cast(),
                )
            },
        };
        RdmaError::check("ibv_query_port", rc)?;
        Ok(PortInfo::from_raw(port, &a))
    }

    /// The extended context around `ibv_context` (`verbs_get_ctx`), with its size checked so
    /// that the ops read from it exist in the provider's version; `None` for an old provider.
    fn verbs_context(&self) -> Option<&sys::verbs_context> {
        let ctx = self.raw.as_ptr();
        // SAFETY: `ctx` is the open context. When abi_compat says "extended", the context is
        // the last member of a verbs_context that the provider allocated, and `sz` (the
        // member before it) says how many bytes before `context` are valid; new ops are only
        // ever added at the front, so the distance from `context` to an op is the same in
        // every version.
        unsafe {
            if (*ctx).abi_compat as usize != usize::MAX {
                return None;
            }
            let at = std::mem::offset_of!(sys::verbs_context, context);
            let v = &*(ctx as *const u8).sub(at).cast::<sys::verbs_context>();
            let needed = std::mem::size_of::<sys::verbs_context>()
                - std::mem::offset_of!(sys::verbs_context, query_port);
            (v.sz >= needed).then_some(v)
        }
    }

    /// The valid entries of port `port`'s GID table (`ibv_query_gid_ex`).
    pub fn gid_table(&self, port: u8) -> RdmaResult<Vec<GidEntry>> {
        let len = self.query_port(port)?.gid_tbl_len;
        let mut out = Vec::new();
        for index in 0..len {
            let mut e = sys::ibv_gid_entry::default();
            // SAFETY: FFI on the open context; the entry size passed is the struct's.
            let rc = unsafe {
                self.rdma.verbs._ibv_query_gid_ex(
                    self.raw.as_ptr(),
                    port.into(),
                    index,
                    &mut e,
                    0,
                    std::mem::size_of_val(&e),
                )
            };
            match rc {
                0 => {}
                // An empty slot, or one whose network device is gone.
                libc::ENODATA | libc::EINVAL | libc::ENODEV => continue,
                rc => RdmaError::check("ibv_query_gid_ex", rc)?,
            }
            // SAFETY: reading the raw bytes of the GID union (every bit pattern is valid).
            let gid = Gid(unsafe { e.gid.raw });
            if !gid.is_zero() {
                out.push(GidEntry {
                    index,
                    gid,
                    kind: GidType::from_raw(e.gid_type),
                });
            }
        }
        Ok(out)
    }

    /// The GID entry connections on `port` use: `wanted` if given, else the automatic choice
    /// ([`choose_gid`]).
    pub fn choose_gid(&self, port: u8, wanted: Option<u32>) -> RdmaResult<GidChoice> {
        let link = self.query_port(port)?.link_layer;
        choose_gid(&self.gid_table(port)?, link, wanted)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object made from the context holds an Arc of it, so none is left.
        let rc = unsafe { self.rdma.verbs.ibv_close_device(self.raw.as_ptr()) };
        if let Err(e) = RdmaError::check("ibv_close_device", rc) {
            tracing::warn!("{}: {e}", self.name);
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_print_as_sysfs_does() {
        assert_eq!(guid_text(0x0c42_a103_00aa_bb01), "0c42:a103:00aa:bb01");
    }

    #[test]
    fn no_rdma_subsystem_is_a_reason_not_an_errno() {
        let e = no_rdma_subsystem(RdmaError::Verbs {
            call: "ibv_get_device_list",
            errno: libc::ENOSYS,
        });
        assert!(matches!(e, RdmaError::NoDevice(_)));
        assert!(e.to_string().contains("no RDMA subsystem"), "{e}");
    }
}

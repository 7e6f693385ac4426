//! The RDMA devices rdma-core finds, each queried once (limits, ports, the GID connections
//! use) for the tools that describe the machine (`info`, `doctor`), and the small words they
//! print (`yes`/`no`, `ibv_mtu` codes).

use gdasync::gdsync::mlx5::{
    self, Context, DeviceLimits, GidChoice, PortInfo, PortState as RdmaPortState, RdmaError,
};
use gdasync::gdsync::{LinkLayer, PortState};

/// `yes` or `no`.
pub fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// A soft port's state, in ibv_devinfo's words.
pub fn state(s: PortState) -> &'static str {
    match s {
        PortState::Active => "PORT_ACTIVE",
        PortState::Down => "PORT_DOWN",
    }
}

/// A soft port's link layer, in ibv_devinfo's words.
pub fn link_layer(l: LinkLayer) -> &'static str {
    match l {
        LinkLayer::Soft => "soft",
        LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Ethernet => "Ethernet",
    }
}

/// `ibv_mtu` of a size in bytes, as ibv_devinfo prints it next to the size.
pub fn mtu_code(bytes: u32) -> u32 {
    bytes.checked_ilog2().map_or(0, |l| l.saturating_sub(7))
}

/// An RDMA device rdma-core finds, queried once for the text and the JSON.
pub struct RdmaDevice {
    pub name: String,
    /// Its limits and ports, or the call that failed.
    pub query: Result<(DeviceLimits, Vec<RdmaPort>), RdmaError>,
}

pub struct RdmaPort {
    pub info: PortInfo,
    /// The GID connections on the port use.
    pub gid: Result<GidChoice, RdmaError>,
}

impl RdmaDevice {
    /// Whether gdsync's queues can run on it (an mlx5 device with an active port), and why.
    pub fn usable(&self) -> (bool, String) {
        match &self.query {
            Err(e) => (false, e.to_string()),
            Ok((_, ports)) if ports.iter().any(|p| p.info.state == RdmaPortState::Active) => (
                true,
                format!("gdsync's queues run on it: GDSYNC_DEVICE={}", self.name),
            ),
            Ok(_) => (false, "no active port".into()),
        }
    }

    /// The devices, each port with the GID gdsync's automatic choice picks.
    pub fn probe() -> Result<Vec<RdmaDevice>, RdmaError> {
        Self::probe_with_gid(None)
    }

    /// The devices, each port with GID entry `wanted` (as `GDSYNC_GID_INDEX` asks), else
    /// the automatic choice.
    pub fn probe_with_gid(wanted: Option<u32>) -> Result<Vec<RdmaDevice>, RdmaError> {
        Ok(mlx5::devices()?
            .into_iter()
            .map(|d| RdmaDevice {
                query: Self::query(&d.name, wanted),
                name: d.name,
            })
            .collect())
    }

    fn query(name: &str, wanted: Option<u32>) -> Result<(DeviceLimits, Vec<RdmaPort>), RdmaError> {
        let ctx = Context::open(name)?;
        let limits = ctx.query_device()?;
        let ports = (1..=limits.phys_port_cnt)
            .map(|p| {
                Ok(RdmaPort {
                    info: ctx.query_port(p)?,
                    gid: ctx.choose_gid(p, wanted),
                })
            })
            .collect::<Result<_, RdmaError>>()?;
        Ok((limits, ports))
    }
}

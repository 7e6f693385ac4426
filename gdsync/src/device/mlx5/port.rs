//! A port as `ibv_query_port` describes it: state, MTUs, link layer, LID, GID table size, in
//! the words `ibv_devinfo` prints.

use super::sys;

/// `IBV_LINK_LAYER_INFINIBAND` (an anonymous enum in verbs.h).
const LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
const LINK_LAYER_ETHERNET: u8 = 2;

/// How a port's packets travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: peers are addressed by LID.
    InfiniBand,
    /// Ethernet (RoCE): peers are addressed by GID.
    Ethernet,
    /// Not reported (an old kernel: treated as InfiniBand, as rdma-core does).
    Unspecified,
}

impl LinkLayer {
    fn from_raw(v: u8) -> Self {
        match v {
            LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
            LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            _ => LinkLayer::Unspecified,
        }
    }

    /// Whether peers are addressed by GID (RoCE) rather than by LID.
    pub fn is_ethernet(self) -> bool {
        self == LinkLayer::Ethernet
    }
}

impl std::fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Unspecified => "Unspecified",
        })
    }
}

/// A port's logical state (`ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// No state change.
    Nop,
    /// Down: no link.
    Down,
    /// Link up, not yet configured by the subnet manager.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Up: can send and receive.
    Active,
    /// Active, deferring.
    ActiveDefer,
    /// A value this version does not know.
    Other(u32),
}

impl PortState {
    fn from_raw(v: sys::ibv_port_state) -> Self {
        match v {
            sys::IBV_PORT_NOP => PortState::Nop,
            sys::IBV_PORT_DOWN => PortState::Down,
            sys::IBV_PORT_INIT => PortState::Init,
            sys::IBV_PORT_ARMED => PortState::Armed,
            sys::IBV_PORT_ACTIVE => PortState::Active,
            sys::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            v => PortState::Other(v),
        }
    }
}

impl PortState {
    /// The name `ibv_devinfo` prints (`PORT_ACTIVE`), and the `ibv_port_state` value.
    pub fn name_and_value(&self) -> (&'static str, u32) {
        match *self {
            PortState::Nop => ("PORT_NOP", 0),
            PortState::Down => ("PORT_DOWN", 1),
            PortState::Init => ("PORT_INIT", 2),
            PortState::Armed => ("PORT_ARMED", 3),
            PortState::Active => ("PORT_ACTIVE", 4),
            PortState::ActiveDefer => ("PORT_ACTIVE_DEFER", 5),
            PortState::Other(v) => ("unknown", v),
        }
    }
}

impl std::fmt::Display for PortState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As ibv_devinfo prints it: "PORT_ACTIVE (4)".
        let (name, v) = self.name_and_value();
        write!(f, "{name} ({v})")
    }
}

/// Bytes of an `ibv_mtu` (256 << (mtu - 1)); 0 for a value that is not one.
pub(crate) fn mtu_bytes(mtu: sys::ibv_mtu) -> u32 {
    match mtu {
        sys::IBV_MTU_256..=sys::IBV_MTU_4096 => 256 << (mtu - 1),
        _ => 0,
    }
}

/// The `ibv_mtu` of a size in bytes, if it is one of 256, 512, 1024, 2048, 4096.
pub(crate) fn mtu_enum(bytes: u32) -> Option<sys::ibv_mtu> {
    (sys::IBV_MTU_256..=sys::IBV_MTU_4096).find(|&m| mtu_bytes(m) == bytes)
}

/// A port's attributes (`ibv_port_attr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// The port number (from 1).
    pub port: u8,
    /// Logical state.
    pub state: PortState,
    /// Physical state (`phys_state`: 5 = LinkUp).
    pub phys_state: u8,
    /// Largest MTU the port supports, in bytes.
    pub max_mtu: u32,
    /// MTU in use, in bytes: what a connection on this port must use.
    pub active_mtu: u32,
    /// How packets travel.
    pub link_layer: LinkLayer,
    /// The port's LID (InfiniBand; 0 on Ethernet).
    pub lid: u16,
    /// The subnet manager's LID.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Entries in the P_Key table.
    pub pkey_tbl_len: u16,
    /// Largest message, in bytes.
    pub max_msg_sz: u32,
    /// Capability flags (`port_cap_flags`).
    pub port_cap_flags: u32,
    /// Link width (`active_width`, an encoded value).
    pub active_width: u8,
    /// Link speed (`active_speed`, an encoded value).
    pub active_speed: u8,
}

impl PortInfo {
    pub(crate) fn from_raw(port: u8, a: &sys::ibv_port_attr) -> Self {
        PortInfo {
            port,
            state: PortState::from_raw(a.state),
            phys_state: a.phys_state,
            max_mtu: mtu_bytes(a.max_mtu),
            active_mtu: mtu_bytes(a.active_mtu),
            link_layer: LinkLayer::from_raw(a.link_layer),
            lid: a.lid,
            sm_lid: a.sm_lid,
            lmc: a.lmc,
            gid_tbl_len: a.gid_tbl_len.max(0) as u32,
            pkey_tbl_len: a.pkey_tbl_len,
            max_msg_sz: a.max_msg_sz,
            port_cap_flags: a.port_cap_flags,
            active_width: a.active_width,
            active_speed: a.active_speed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtus_convert_both_ways() {
        assert_eq!(mtu_bytes(sys::IBV_MTU_256), 256);
        assert_eq!(mtu_bytes(sys::IBV_MTU_4096), 4096);
        assert_eq!(mtu_bytes(0), 0);
        assert_eq!(mtu_bytes(6), 0);
        for m in sys::IBV_MTU_256..=sys::IBV_MTU_4096 {
            assert_eq!(mtu_enum(mtu_bytes(m)), Some(m));
        }
        assert_eq!(mtu_enum(1500), None);
    }

    #[test]
    fn a_port_reads_as_ibv_devinfo_prints_it() {
        let raw = sys::ibv_port_attr {
            state: sys::IBV_PORT_ACTIVE,
            max_mtu: sys::IBV_MTU_4096,
            active_mtu: sys::IBV_MTU_1024,
            gid_tbl_len: 256,
            link_layer: LINK_LAYER_ETHERNET,
            ..Default::default()
        };
        let p = PortInfo::from_raw(1, &raw);
        assert_eq!(p.state.to_string(), "PORT_ACTIVE (4)");
        assert_eq!((p.max_mtu, p.active_mtu), (4096, 1024));
        assert!(p.link_layer.is_ethernet());
        assert_eq!(p.link_layer.to_string(), "Ethernet");
        let ib = PortInfo::from_raw(
            2,
            &sys::ibv_port_attr {
                link_layer: LINK_LAYER_INFINIBAND,
                state: 9,
                ..raw
            },
        );
        assert_eq!(ib.link_layer, LinkLayer::InfiniBand);
        assert_eq!(ib.state, PortState::Other(9));
    }
}

//! The GID table of a port and which entry a connection uses: on RoCE the RoCE v2 entry with
//! an IPv4-mapped address (routable, and what `show_gids` marks as the usual choice), unless
//! the user names an index; on InfiniBand entry 0.

use super::error::RdmaError;
use super::port::LinkLayer;
use super::sys;
use super::RdmaResult;

/// A 128-bit GID, in network byte order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// Whether all bytes are zero (an unused table entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        std::net::Ipv6Addr::from(self.0).to_ipv4_mapped()
    }
}

impl std::fmt::Display for Gid {
    /// As sysfs and `ibv_devinfo -v` print it: eight groups of four hex digits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            let sep = if i == 0 { "" } else { ":" };
            write!(f, "{sep}{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// What kind of address a GID entry is (`ibv_gid_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
    /// A value this version does not know.
    Other(u32),
}

impl GidType {
    pub(crate) fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_GID_TYPE_IB => GidType::Ib,
            sys::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            sys::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            v => GidType::Other(v),
        }
    }
}

impl std::fmt::Display for GidType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GidType::Ib => f.write_str("IB"),
            GidType::RoceV1 => f.write_str("RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Other(v) => write!(f, "type {v}"),
        }
    }
}

/// One valid entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index (`sgid_index` when connecting).
    pub index: u32,
    /// The address.
    pub gid: Gid,
    /// Its kind.
    pub kind: GidType,
}

/// The entry a connection uses, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidChoice {
    /// The entry.
    pub entry: GidEntry,
    /// Why this one: "asked for", "RoCE v2, IPv4-mapped", ...
    pub why: &'static str,
}

/// Picks the GID entry for connections on a port with link layer `link`: `wanted` where the
/// user named an index, else the first RoCE v2 entry with an IPv4-mapped address, then any
/// RoCE v2 entry, then RoCE v1 (Ethernet), or entry 0 (InfiniBand).
pub fn choose_gid(
    table: &[GidEntry],
    link: LinkLayer,
    wanted: Option<u32>,
) -> RdmaResult<GidChoice> {
    let valid = || table.iter().filter(|e| !e.gid.is_zero());
    if let Some(index) = wanted {
        return valid()
            .find(|e| e.index == index)
            .map(|&entry| GidChoice {
                entry,
                why: "asked for",
            })
            .ok_or_else(|| {
                RdmaError::InvalidArgument(format!(
                    "GID index {index} is not a valid entry of the port's GID table (valid: {})",
                    list(valid())
                ))
            });
    }
    let first = |ok: &dyn Fn(&GidEntry) -> bool, why| {
        valid()
            .find(|e| ok(e))
            .map(|&entry| GidChoice { entry, why })
    };
    let choice = if link.is_ethernet() {
        first(
            &|e| e.kind == GidType::RoceV2 && e.gid.ipv4().is_some(),
            "RoCE v2, IPv4-mapped",
        )
        .or_else(|| first(&|e| e.kind == GidType::RoceV2, "RoCE v2"))
        .or_else(|| first(&|e| e.kind == GidType::RoceV1, "RoCE v1 (no RoCE v2 entry)"))
    } else {
        first(&|e| e.index == 0, "InfiniBand port GID")
    };
    choice.ok_or_else(|| {
        RdmaError::NoDevice(format!(
            "no usable GID on this {link} port (entries: {}); on RoCE, give the interface an IP address",
            list(valid())
        ))
    })
}

fn list<'a>(entries: impl Iterator<Item = &'a GidEntry>) -> String {
    let s: Vec<String> = entries
        .map(|e| format!("{} {} {}", e.index, e.kind, e.gid))
        .collect();
    if s.is_empty() {
        "none".into()
    } else {
        s.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, kind: GidType, text: &str) -> GidEntry {
        let ip: std::net::Ipv6Addr = text.parse().unwrap();
        GidEntry {
            index,
            gid: Gid(ip.octets()),
            kind,
        }
    }

    /// A RoCE port's table as mlx5 fills it: link-local v1/v2, then IPv4-mapped v1/v2.
    fn roce_table() -> Vec<GidEntry> {
        vec![
            entry(0, GidType::RoceV1, "fe80::e42:a1ff:feaa:bb01"),
            entry(1, GidType::RoceV2, "fe80::e42:a1ff:feaa:bb01"),
            entry(2, GidType::RoceV1, "::ffff:10.0.0.1"),
            entry(3, GidType::RoceV2, "::ffff:10.0.0.1"),
            entry(4, GidType::RoceV2, "::"),
        ]
    }

    #[test]
    fn roce_picks_the_ipv4_mapped_v2_entry() {
        let c = choose_gid(&roce_table(), LinkLayer::Ethernet, None).unwrap();
        assert_eq!(c.entry.index, 3);
        assert_eq!(c.entry.gid.ipv4(), Some([10, 0, 0, 1].into()));
        assert_eq!(
            c.entry.gid.to_string(),
            "0000:0000:0000:0000:0000:ffff:0a00:0001"
        );
    }

    #[test]
    fn roce_falls_back_to_any_v2_then_v1() {
        let t = roce_table();
        let c = choose_gid(&t[..2], LinkLayer::Ethernet, None).unwrap();
        assert_eq!((c.entry.index, c.why), (1, "RoCE v2"));
        let c = choose_gid(&t[..1], LinkLayer::Ethernet, None).unwrap();
        assert_eq!(c.entry.index, 0);
        assert!(c.why.starts_with("RoCE v1"));
    }

    #[test]
    fn an_index_asked_for_wins_and_a_bad_one_is_refused() {
        let t = roce_table();
        let c = choose_gid(&t, LinkLayer::Ethernet, Some(1)).unwrap();
        assert_eq!((c.entry.index, c.why), (1, "asked for"));
        // Entry 4 is all zeros (unused), 9 does not exist.
        for bad in [4, 9] {
            let e = choose_gid(&t, LinkLayer::Ethernet, Some(bad)).unwrap_err();
            assert!(e.to_string().contains(&format!("GID index {bad}")), "{e}");
        }
    }

    #[test]
    fn infiniband_uses_entry_zero_and_an_empty_table_is_reported() {
        let ib = vec![entry(0, GidType::Ib, "fe80::1")];
        let c = choose_gid(&ib, LinkLayer::InfiniBand, None).unwrap();
        assert_eq!(c.entry.index, 0);
        let e = choose_gid(&[], LinkLayer::Ethernet, None).unwrap_err();
        assert!(matches!(e, RdmaError::NoDevice(_)), "{e:?}");
        assert!(e.to_string().contains("entries: none"), "{e}");
    }
}

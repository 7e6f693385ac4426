//! The fake sysfs tree rdma-core reads under `SYSFS_PATH`: `class/infiniband_verbs/uverbsN`
//! for each device and `class/infiniband/<name>` with its identity, ports and GID tables, as
//! the mlx5 kernel driver lays them out (a ConnectX-6 Dx's PCI id), and `uvemu/` with the
//! emulator's node number and fabric directory (see [`crate::fabric`]). A device's addresses
//! name its node, so that a peer's driver can tell which emulator they belong to.

use std::fs;
use std::io;
use std::path::Path;

/// How a port's packets travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortKind {
    /// RoCE (link layer Ethernet): GIDs from IP addresses, no LID.
    Roce,
    /// InfiniBand: a LID from the subnet manager.
    InfiniBand,
}

/// A device to emulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Its name (`mlx5_0`).
    pub name: String,
    /// Its ports, from port 1.
    pub ports: Vec<PortKind>,
}

/// Most devices and ports per device the preload library serves.
const MAX_DEVICES: usize = 8;
const MAX_PORTS: usize = 4;
/// GID table entries per port (what the library's QUERY_PORT reports).
const GID_TABLE_LEN: usize = 16;

/// Parses `mlx5_0,mlx5_1:ib:roce`: comma-separated devices, each a name and its ports
/// (`roce` or `ib`, one RoCE port where none are given).
pub fn parse_devices(spec: &str) -> Result<Vec<DeviceSpec>, String> {
    let mut out = Vec::new();
    for dev in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mut parts = dev.split(':');
        let name = parts.next().unwrap_or_default();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("device name {name:?}: letters, digits and _ only"));
        }
        let ports = parts
            .map(|p| match p {
                "roce" => Ok(PortKind::Roce),
                "ib" => Ok(PortKind::InfiniBand),
                p => Err(format!("port kind {p:?} of {name}: expected roce or ib")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ports = if ports.is_empty() {
            vec![PortKind::Roce]
        } else {
            ports
        };
        if ports.len() > MAX_PORTS {
            return Err(format!("{name}: at most {MAX_PORTS} ports"));
        }
        out.push(DeviceSpec {
            name: name.into(),
            ports,
        });
    }
    if out.len() > MAX_DEVICES {
        return Err(format!("at most {MAX_DEVICES} devices"));
    }
    Ok(out)
}

fn put(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, format!("{text}\n"))
}

/// A GID as sysfs prints it.
fn gid_text(b: [u8; 16]) -> String {
    b.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// Writes the tree for `devices` of node `node` (1 to [`crate::fabric::MAX_NODES`]) under
/// `root` (replacing what was there), with `fabric` the directory where processes publish
/// how to reach their devices. Device `d` is `uverbs<d>`; RoCE port `p` of it has the IPv4
/// address 10.`d`.`p`.`node`, InfiniBand port `p` the LID `node * 32 + d * 4 + p - 1`.
pub fn write_sysfs(root: &Path, devices: &[DeviceSpec], node: u8, fabric: &Path) -> io::Result<()> {
    let _ = fs::remove_dir_all(root);
    put(&root.join("uvemu/node"), &node.to_string())?;
    put(&root.join("uvemu/fabric"), &fabric.to_string_lossy())?;
    let verbs = root.join("class/infiniband_verbs");
    fs::create_dir_all(&verbs)?;
    fs::create_dir_all(root.join("class/infiniband"))?;
    put(&verbs.join("abi_version"), "6")?;
    for (d, dev) in devices.iter().enumerate() {
        let uv = verbs.join(format!("uverbs{d}"));
        put(&uv.join("ibdev"), &dev.name)?;
        put(&uv.join("dev"), &format!("231:{}", 192 + d))?;
        put(&uv.join("abi_version"), "1")?;
        let ib = root.join("class/infiniband").join(&dev.name);
        let guid = format!("0c42:a103:00{node:02x}:{d:02x}01");
        put(&ib.join("node_type"), "1: CA")?;
        put(&ib.join("node_guid"), &guid)?;
        put(&ib.join("sys_image_guid"), &guid)?;
        put(&ib.join("fw_ver"), "22.36.1010")?;
        put(&ib.join("hca_type"), "MT4125")?;
        put(&ib.join("hw_rev"), "0x0")?;
        put(&ib.join("board_id"), "MT_0000000359")?;
        put(
            &ib.join("device/modalias"),
            "pci:v000015B3d0000101Dsv000015B3sd00000016bc02sc00i00",
        )?;
        for (i, kind) in dev.ports.iter().enumerate() {
            let at = PortAt {
                node,
                dev: d as u8,
                port: i as u8 + 1,
            };
            write_port(&ib.join(format!("ports/{}", i + 1)), at, *kind)?;
        }
    }
    Ok(())
}

/// Which port of which device of which node.
#[derive(Clone, Copy)]
struct PortAt {
    node: u8,
    dev: u8,
    port: u8,
}

fn write_port(dir: &Path, at: PortAt, kind: PortKind) -> io::Result<()> {
    let PortAt { node, dev, port } = at;
    let roce = kind == PortKind::Roce;
    put(
        &dir.join("link_layer"),
        if roce { "Ethernet" } else { "InfiniBand" },
    )?;
    put(&dir.join("state"), "4: ACTIVE")?;
    put(&dir.join("phys_state"), "5: LinkUp")?;
    // What QUERY_PORT reports: 4X (active_width 2) at HDR (active_speed 64, 50 Gb/s a lane).
    put(&dir.join("rate"), "200 Gb/sec (4X HDR)")?;
    let lid = match roce {
        true => 0,
        false => (node as usize) << 5 | (dev as usize) << 2 | (port as usize - 1),
    };
    put(&dir.join("lid"), &format!("{lid:#x}"))?;
    put(&dir.join("sm_lid"), if roce { "0x0" } else { "0x1" })?;
    put(&dir.join("lid_mask_count"), "0")?;
    put(&dir.join("pkeys/0"), "0xffff")?;
    let mut link_local = [0u8; 16];
    link_local[..2].copy_from_slice(&[0xfe, 0x80]);
    link_local[8..].copy_from_slice(&[0x0e, 0x42, 0xa1, 0xff, 0xfe, node, dev, port]);
    let mut mapped = [0u8; 16];
    mapped[10..12].copy_from_slice(&[0xff, 0xff]);
    mapped[12..].copy_from_slice(&[10, dev, port, node]);
    // mlx5 on RoCE: link-local v1, v2, then the interface's IPv4 address as v1, v2.
    let entries: Vec<([u8; 16], &str)> = if roce {
        vec![
            (link_local, "IB/RoCE v1"),
            (link_local, "RoCE v2"),
            (mapped, "IB/RoCE v1"),
            (mapped, "RoCE v2"),
        ]
    } else {
        vec![(link_local, "IB/RoCE v1")]
    };
    for i in 0..GID_TABLE_LEN {
        let (gid, kind) = entries.get(i).copied().unwrap_or(([0; 16], ""));
        put(&dir.join(format!("gids/{i}")), &gid_text(gid))?;
        if !kind.is_empty() {
            put(&dir.join(format!("gid_attrs/types/{i}")), kind)?;
            // rdma-core resolves a RoCE GID's network device by name, so it must exist here:
            // the loopback interface always does. InfiniBand GIDs have none (the file reads
            // empty).
            let ndev = if roce { "lo\n" } else { "" };
            fs::create_dir_all(dir.join("gid_attrs/ndevs"))?;
            fs::write(dir.join(format!("gid_attrs/ndevs/{i}")), ndev)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_specs_parse_and_bad_ones_say_why() {
        let d = parse_devices("mlx5_0, mlx5_1:ib:roce").unwrap();
        assert_eq!(d[0].ports, vec![PortKind::Roce]);
        assert_eq!(d[1].name, "mlx5_1");
        assert_eq!(d[1].ports, vec![PortKind::InfiniBand, PortKind::Roce]);
        assert!(parse_devices("").unwrap().is_empty());
        assert!(parse_devices("mlx5_0:eth")
            .unwrap_err()
            .contains("roce or ib"));
        assert!(parse_devices("../x").unwrap_err().contains("letters"));
        assert!(parse_devices("a:ib:ib:ib:ib:ib")
            .unwrap_err()
            .contains("at most"));
    }

    #[test]
    fn the_tree_has_what_rdma_core_reads() {
        let root = std::env::temp_dir().join(format!("uvemu-sysfs-test-{}", std::process::id()));
        let devs = parse_devices("mlx5_0,mlx5_1:ib").unwrap();
        write_sysfs(&root, &devs, 3, Path::new("/tmp/fab")).unwrap();
        let read = |p: &str| fs::read_to_string(root.join(p)).unwrap();
        assert_eq!(read("class/infiniband_verbs/uverbs1/ibdev"), "mlx5_1\n");
        assert_eq!(read("class/infiniband_verbs/uverbs1/dev"), "231:193\n");
        let port = "class/infiniband/mlx5_0/ports/1";
        assert_eq!(read(&format!("{port}/link_layer")), "Ethernet\n");
        assert_eq!(
            read(&format!("{port}/gids/3")),
            "0000:0000:0000:0000:0000:ffff:0a00:0103\n"
        );
        assert_eq!(
            read(&format!("{port}/gids/0")),
            "fe80:0000:0000:0000:0e42:a1ff:fe03:0001\n"
        );
        assert_eq!(read("uvemu/node"), "3\n");
        assert_eq!(read("uvemu/fabric"), "/tmp/fab\n");
        assert_eq!(read(&format!("{port}/gid_attrs/types/3")), "RoCE v2\n");
        assert_eq!(read("class/infiniband/mlx5_1/ports/1/lid"), "0x64\n");
        fs::remove_dir_all(&root).unwrap();
    }
}

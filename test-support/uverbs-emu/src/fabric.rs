//! The fabric that links processes running under different emulators of one host, as a
//! subnet links the hosts of a cluster. Each [`Emulator`](crate::Emulator) is a node: it
//! claims a node number, which its devices' GIDs and LIDs carry (see
//! [`write_sysfs`](crate::write_sysfs)). The fabric directory holds one folder per node,
//! `node-<n>`, with the pid of the emulator's owner in `owner`, and `dev-<d>`: how to reach
//! device `d` of that node, published by the process whose soft HCA serves it (gdsync's
//! endpoint wire form). A driver whose QP is given a path to another node's address reads
//! that record and links its soft HCA to the peer's as two soft devices link (shared memory
//! on one host, TCP where the soft device's link policy asks for it).

use std::io;
use std::path::{Path, PathBuf};

/// Most nodes (emulators) live at once on one host: a node number is a GID byte.
pub const MAX_NODES: u8 = 250;

/// The fabric directory of this host (and user's temporary directory).
pub fn directory() -> PathBuf {
    std::env::temp_dir().join("uvemu-fabric")
}

/// A node number claimed in the fabric directory; released on drop.
#[derive(Debug)]
pub struct Node {
    number: u8,
    dir: PathBuf,
}

impl Node {
    /// Claims the lowest free node number in `fabric`. A folder whose owner has exited (a
    /// crashed test) is taken over.
    pub fn claim(fabric: &Path) -> Result<Node, String> {
        let fail = |e: io::Error| format!("fabric directory {}: {e}", fabric.display());
        std::fs::create_dir_all(fabric).map_err(fail)?;
        for number in 1..=MAX_NODES {
            let dir = fabric.join(format!("node-{number}"));
            if owner_gone(&dir) {
                let _ = std::fs::remove_dir_all(&dir);
            }
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    let owner = std::process::id().to_string();
                    std::fs::write(dir.join("owner"), owner).map_err(fail)?;
                    return Ok(Node { number, dir });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(fail(e)),
            }
        }
        Err(format!(
            "fabric directory {}: all {MAX_NODES} node numbers are taken",
            fabric.display()
        ))
    }

    /// The node number.
    pub fn number(&self) -> u8 {
        self.number
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether node folder `dir` names an owner that no longer runs. A folder without a readable
/// owner is being claimed right now: it is left alone.
fn owner_gone(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("owner")) else {
        return false;
    };
    let Ok(pid) = text.trim().parse::<libc::pid_t>() else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_distinct_and_a_dead_owners_node_is_taken_over() {
        let fabric = std::env::temp_dir().join(format!("uvemu-fabric-test-{}", std::process::id()));
        let a = Node::claim(&fabric).unwrap();
        let b = Node::claim(&fabric).unwrap();
        assert_eq!((a.number(), b.number()), (1, 2));
        drop(a);
        let c = Node::claim(&fabric).unwrap();
        assert_eq!(c.number(), 1, "a released number is reused");
        // A node whose owner has exited (no process has pid 0x7fff_fff0).
        std::fs::create_dir(fabric.join("node-3")).unwrap();
        std::fs::write(fabric.join("node-3/owner"), "2147483632").unwrap();
        // One being claimed (no owner yet) stays taken.
        std::fs::create_dir(fabric.join("node-4")).unwrap();
        let d = Node::claim(&fabric).unwrap();
        let e = Node::claim(&fabric).unwrap();
        assert_eq!((d.number(), e.number()), (3, 5));
        drop((b, c, d, e));
        std::fs::remove_dir_all(&fabric).unwrap();
    }
}

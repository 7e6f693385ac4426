//! `--ranks-as procs`: this program started again as local rank processes (with
//! `mp::bootstrap::launch_local`, which gives them the TCP bootstrap's environment), and
//! waited for; the first rank that fails stops the others.

use anyhow::{bail, Result};
use gdasync::mp::bootstrap::launch_local;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

/// The hidden flag that makes a started process a rank.
pub const CHILD_FLAG: &str = "--child";

/// Starts `n` ranks of this program with this process's arguments and [`CHILD_FLAG`], and
/// waits until all have ended. A rank that fails ends the others; a rank whose stdout reader
/// went away (`| head`) ends this process the same quiet way.
pub fn run_local(n: usize) -> Result<()> {
    let exe = std::env::current_exe()?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.push(CHILD_FLAG.into());
    let mut children = launch_local(n, &exe, &args)?;
    tracing::debug!(ranks = n, program = %exe.display(), "started the rank processes");
    let mut done = vec![false; children.len()];
    while done.iter().any(|d| !d) {
        for r in 0..children.len() {
            if done[r] {
                continue;
            }
            let Some(st) = children[r].try_wait()? else {
                continue;
            };
            done[r] = true;
            if st.success() {
                continue;
            }
            for (k, other) in children.iter_mut().enumerate() {
                if !done[k] {
                    let _ = other.kill();
                    let _ = other.wait();
                }
            }
            if st.signal() == Some(libc::SIGPIPE) {
                super::out::reader_gone();
            }
            bail!("rank {r} failed ({st}); its error is above");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

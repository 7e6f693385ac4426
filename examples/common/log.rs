//! Logging: a `tracing` subscriber writing to stderr, filtered by `GDSYNC_LOG` (e.g.
//! `GDSYNC_LOG=debug`, `GDSYNC_LOG=gdsync::device=trace`: levels and `TARGET=LEVEL` directives); without it,
//! warnings only, or debug with `--debug`.

use std::io::IsTerminal;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

/// The variable that sets the log filter.
pub const LOG_VAR: &str = "GDSYNC_LOG";

/// Installs the subscriber. An invalid `GDSYNC_LOG` is an error (`gdsync::env`'s rule: a
/// misspelt level is not taken for a target).
pub fn init(debug: bool) -> anyhow::Result<()> {
    let set = std::env::var(LOG_VAR).ok().filter(|v| !v.trim().is_empty());
    if let Some(v) = &set {
        // The rule's message alone ("GDSYNC_LOG=...: expected ..."), as the filter's own.
        gdasync::gdsync::env::check_log_filter(LOG_VAR, v).map_err(|e| match e {
            gdasync::gdsync::Error::InvalidArgument(m) => anyhow::anyhow!(m),
            e => e.into(),
        })?;
    }
    let filter = match &set {
        Some(v) => v
            .parse::<Targets>()
            .map_err(|e| anyhow::anyhow!("{LOG_VAR}={v:?} is not a log filter: {e}"))?,
        None if debug => Targets::new().with_default(tracing::Level::DEBUG),
        None => Targets::new().with_default(tracing::Level::WARN),
    };
    let detailed = set.is_some() || debug;
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(detailed)
        .with_thread_names(detailed);
    let registry = tracing_subscriber::registry().with(filter);
    // A subscriber installed already (a second call) keeps its settings.
    let _ = if detailed {
        registry
            .with(layer.with_timer(tracing_subscriber::fmt::time::uptime()))
            .try_init()
    } else {
        registry.with(layer.without_time()).try_init()
    };
    Ok(())
}

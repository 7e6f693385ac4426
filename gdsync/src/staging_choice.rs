//! Which path GPU payloads take to the NIC: registered for DMA directly (GPUDirect RDMA:
//! dma-buf or peer memory) or staged through pinned host bounce buffers ([`crate::staging`]),
//! chosen automatically from what the device can register, by `GDSYNC_STAGING`, or by the
//! caller.

use crate::Result;

/// How payloads in GPU memory reach the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuMemoryPath {
    /// The NIC reads and writes GPU memory itself (GPUDirect RDMA).
    Direct,
    /// Through pinned host bounce buffers, copied in the trigger's own order.
    Staged,
}

impl GpuMemoryPath {
    /// The path `GDSYNC_STAGING` (auto | on | off) asks for; `None` for auto or unset.
    pub fn from_env() -> Result<Option<GpuMemoryPath>> {
        Ok(
            match crate::env::choice("GDSYNC_STAGING", &["auto", "on", "off"])? {
                Some("on") => Some(GpuMemoryPath::Staged),
                Some("off") => Some(GpuMemoryPath::Direct),
                _ => None,
            },
        )
    }

    /// The path for the soft device, and why: `asked` (the caller's switch) if given, else
    /// `GDSYNC_STAGING` if set, else staged (its engine cannot DMA GPU memory: it would copy
    /// each payload synchronously from its own thread). Direct when asked for: the soft
    /// device registers GPU memory, at that cost, so both paths can be compared.
    pub fn choose_soft(asked: Option<GpuMemoryPath>) -> Result<(GpuMemoryPath, String)> {
        Ok(soft(choose(asked, Self::from_env()?, &Ok(()))))
    }

    /// The path for an mlx5 device on a GPU that does (`dma_buf`) or does not export dma-bufs,
    /// with the peer-memory module loaded or not ([`peer_memory_loaded`]), and why.
    pub fn choose_mlx5(
        asked: Option<GpuMemoryPath>,
        dma_buf: bool,
        peer_memory: bool,
    ) -> Result<(GpuMemoryPath, String)> {
        let direct = match (dma_buf, peer_memory) {
            (true, _) => Ok("the GPU exports dma-bufs"),
            (false, true) => Ok("the peer-memory module is loaded"),
            (false, false) => Err("GPU memory cannot be registered: no dma-buf export and no peer-memory module (nvidia-peermem)".to_string()),
        };
        Ok(choose(asked, Self::from_env()?, &direct.map(|_| ())))
    }
}

/// The path, and why: the caller's `asked`, else the setting `env`, else direct where GPU
/// memory can be registered for DMA (`direct`: `Err(why)` where it cannot). Direct asked for
/// where it is impossible is staged, and says so.
pub(crate) fn choose(
    asked: Option<GpuMemoryPath>,
    env: Option<GpuMemoryPath>,
    direct: &std::result::Result<(), String>,
) -> (GpuMemoryPath, String) {
    let (want, by) = match (asked, env) {
        (Some(p), _) => (Some(p), "asked by the program"),
        (None, Some(p)) => (Some(p), "set by GDSYNC_STAGING"),
        (None, None) => (None, "auto"),
    };
    match (want, direct) {
        (Some(GpuMemoryPath::Direct), Err(why)) => {
            (GpuMemoryPath::Staged, format!("{by}: direct, but {why}"))
        }
        (Some(p), _) => (p, by.to_string()),
        (None, Ok(())) => (
            GpuMemoryPath::Direct,
            "auto: the device registers GPU memory for DMA".into(),
        ),
        (None, Err(why)) => (GpuMemoryPath::Staged, format!("auto: {why}")),
    }
}

/// The soft device's path from `choose` with direct possible: automatic direct becomes staged
/// (the engine's synchronous copies are the slow path), direct asked for stays direct and
/// says what it costs.
fn soft((path, by): (GpuMemoryPath, String)) -> (GpuMemoryPath, String) {
    match path {
        GpuMemoryPath::Direct if by.starts_with("auto") => (
            GpuMemoryPath::Staged,
            "auto: the soft device cannot DMA GPU memory (its engine would copy every payload synchronously)".into(),
        ),
        GpuMemoryPath::Direct => (
            path,
            format!("{by}: the soft device's engine copies each GPU payload synchronously"),
        ),
        GpuMemoryPath::Staged => (path, by),
    }
}

/// Whether a GPU peer-memory kernel module (`nvidia_peermem`, or the older `nv_peer_mem`)
/// is loaded, so that an RDMA device can register device pointers.
pub fn peer_memory_loaded() -> bool {
    ["/sys/module/nvidia_peermem", "/sys/module/nv_peer_mem"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
}

#[cfg(test)]
mod tests {
    use super::{choose, GpuMemoryPath as P};

    #[test]
    fn staging_is_chosen_where_gpu_memory_cannot_be_registered() {
        let no: Result<(), String> = Err("no dma-buf".into());
        assert_eq!(choose(None, None, &Ok(())).0, P::Direct);
        let (p, why) = choose(None, None, &no);
        assert_eq!((p, why.as_str()), (P::Staged, "auto: no dma-buf"));
        assert_eq!(choose(None, Some(P::Staged), &Ok(())).0, P::Staged);
        assert_eq!(
            choose(Some(P::Staged), Some(P::Direct), &Ok(())).0,
            P::Staged
        );
        assert_eq!(
            choose(Some(P::Direct), Some(P::Staged), &Ok(())).0,
            P::Direct
        );
        let (p, why) = choose(Some(P::Direct), None, &no);
        assert_eq!(p, P::Staged, "direct where it is impossible");
        assert!(why.contains("no dma-buf"), "{why}");
    }

    #[test]
    fn mlx5_goes_direct_with_dma_buf_or_peer_memory() {
        if std::env::var_os("GDSYNC_STAGING").is_some() {
            return;
        }
        assert_eq!(P::choose_mlx5(None, true, false).unwrap().0, P::Direct);
        assert_eq!(P::choose_mlx5(None, false, true).unwrap().0, P::Direct);
        assert_eq!(P::choose_mlx5(None, false, false).unwrap().0, P::Staged);
        assert_eq!(P::choose_soft(None).unwrap().0, P::Staged);
    }

    #[test]
    fn the_soft_device_goes_direct_only_when_asked() {
        use super::soft;
        let auto = soft(choose(None, None, &Ok(())));
        assert_eq!(auto.0, P::Staged);
        assert!(auto.1.contains("cannot DMA GPU memory"), "{}", auto.1);
        let off = soft(choose(Some(P::Direct), None, &Ok(())));
        assert_eq!(off.0, P::Direct, "{}", off.1);
        assert!(off.1.starts_with("asked by the program"), "{}", off.1);
        let env_off = soft(choose(None, Some(P::Direct), &Ok(())));
        assert_eq!(env_off.0, P::Direct, "{}", env_off.1);
        assert_eq!(soft(choose(Some(P::Staged), None, &Ok(()))).0, P::Staged);
    }
}

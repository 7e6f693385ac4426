//! Message sizes on the command line: `--size 4096` or `--sizes 8,4K,1M` in every tool that
//! takes sizes, with binary suffixes (K = 1024, as in `nccl-tests`).

/// `--size` / `--sizes`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SizeArgs {
    /// One message size in bytes (suffixes K, M, G: powers of 1024).
    #[arg(long, value_parser = parse_size, conflicts_with = "sizes")]
    pub size: Option<usize>,
    /// Comma-separated message sizes in bytes (e.g. 8,4K,1M).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Option<Vec<usize>>,
}

impl SizeArgs {
    /// The sizes given, or `default`.
    pub fn or(&self, default: impl FnOnce() -> Vec<usize>) -> Vec<usize> {
        match (&self.size, &self.sizes) {
            (Some(s), _) => vec![*s],
            (None, Some(v)) => v.clone(),
            (None, None) => default(),
        }
    }
}

/// Checks sizes against what a tool can move: `min..=max` bytes; `why_min` says why the
/// smallest is what it is.
pub fn check(sizes: &[usize], min: usize, max: usize, why_min: &str) -> anyhow::Result<()> {
    if sizes.is_empty() {
        anyhow::bail!("--sizes: no sizes given");
    }
    if let Some(&s) = sizes.iter().find(|&&s| s < min) {
        anyhow::bail!("message size {s}: sizes must be at least {min} byte(s) ({why_min})");
    }
    if let Some(&s) = sizes.iter().find(|&&s| s > max) {
        anyhow::bail!("message size {s}: sizes must be at most {}", human(max));
    }
    Ok(())
}

/// `4096`, `4K`, `4k`, `4KiB`, `1M`, `2G`: bytes.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("{s:?} is not a size (bytes, or with K, M, G)")),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or with K, M, G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `1 GiB`, `64 KiB`, `100 B`: a size for messages.
pub fn human(n: usize) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4kib"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("18446744073709551615G").is_err());
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(100), "100 B");
    }
}

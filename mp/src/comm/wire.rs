//! The records ranks exchange through the bootstrap when they connect: a region's address,
//! length and key, and a rank's connection record (its control region and the endpoints of
//! the QPs that connect to each rank). Bytes from other ranks are decoded with checks, never
//! trusted.

use gdsync::{Endpoint, Error, RemoteBuf, Result};

/// Bytes of one endpoint in the connection record.
const EP_BYTES: usize = Endpoint::WIRE_LEN;

/// Bytes of a region's record: address, length (u64 LE each) and key (u32 LE).
pub(crate) const REMOTE_BYTES: usize = 20;

/// Appends `r`'s record ([`REMOTE_BYTES`] bytes).
pub(crate) fn encode_remote(r: &RemoteBuf, out: &mut Vec<u8>) {
    out.extend_from_slice(&r.addr.to_le_bytes());
    out.extend_from_slice(&r.len.to_le_bytes());
    out.extend_from_slice(&r.rkey.to_le_bytes());
}

/// Parses a region's record; `None` unless `b` is exactly [`REMOTE_BYTES`] long.
pub(crate) fn decode_remote(b: &[u8]) -> Option<RemoteBuf> {
    let b: &[u8; REMOTE_BYTES] = b.try_into().ok()?;
    let (addr, rest) = b.split_first_chunk::<8>()?;
    let (len, rkey) = rest.split_first_chunk::<8>()?;
    Some(RemoteBuf {
        addr: u64::from_le_bytes(*addr),
        len: u64::from_le_bytes(*len),
        rkey: u32::from_le_bytes(rkey.try_into().ok()?),
    })
}

/// An error unless a bootstrap exchange returned one contribution per rank (a custom
/// [`Bootstrap`](crate::bootstrap::Bootstrap) may not).
pub(crate) fn check_gathered(all: &[Vec<u8>], size: usize) -> Result<()> {
    if all.len() != size {
        return Err(Error::invalid(format!(
            "bootstrap: an exchange returned {} contributions for {size} ranks",
            all.len()
        )));
    }
    Ok(())
}

/// A rank's connection record: its control region, then per rank `per` endpoints of the
/// QPs that connect to it (zeros for itself).
pub(crate) fn encode_setup(eps: &[Option<Vec<Endpoint>>], per: usize, ctrl: &RemoteBuf) -> Vec<u8> {
    let mut b = Vec::new();
    encode_remote(ctrl, &mut b);
    for e in eps {
        match e {
            Some(v) => {
                debug_assert_eq!(v.len(), per);
                v.iter().for_each(|e| b.extend_from_slice(&e.to_bytes()));
            }
            None => b.extend_from_slice(&vec![0u8; per * EP_BYTES]),
        }
    }
    b
}

pub(crate) type Setup = (RemoteBuf, Vec<Option<Vec<Endpoint>>>);

/// Parses [`encode_setup`]'s record of a communicator of `size` ranks.
pub(crate) fn decode_setup(b: &[u8], size: usize, per: usize) -> Result<Setup> {
    let malformed = || {
        Error::invalid(
            "bootstrap: a rank sent a malformed connection record (another gdasync version?)",
        )
    };
    let want = per
        .checked_mul(EP_BYTES)
        .and_then(|row| row.checked_mul(size))
        .and_then(|rows| rows.checked_add(REMOTE_BYTES));
    if per == 0 || want != Some(b.len()) {
        return Err(malformed());
    }
    let (ctrl, rows) = b.split_at(REMOTE_BYTES);
    let ctrl = decode_remote(ctrl).ok_or_else(malformed)?;
    let eps = rows
        .chunks(per * EP_BYTES)
        .map(|e| {
            if e.iter().all(|&x| x == 0) {
                Ok(None)
            } else {
                e.chunks(EP_BYTES)
                    .map(Endpoint::from_bytes)
                    .collect::<Result<Vec<_>>>()
                    .map(Some)
            }
        })
        .collect::<Result<_>>()?;
    Ok((ctrl, eps))
}

//! One stable hash for every place that needs a hash to agree across
//! processes, builds and Rust versions (which `std`'s `DefaultHasher` does
//! not promise): sandbox directory names, content fingerprints in events,
//! advisory-lock keys.

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of `bytes`.
///
/// ```
/// assert_eq!(edward_core::hash::fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
/// assert_eq!(edward_core::hash::fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
/// ```
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// 64-bit FNV-1a of several parts, each followed by a separator byte, so
/// `["ab", "c"]` and `["a", "bc"]` differ.
pub fn fnv1a64_parts(parts: &[&[u8]]) -> u64 {
    parts.iter().fold(OFFSET, |h, part| {
        let h = part
            .iter()
            .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME));
        (h ^ 0xff).wrapping_mul(PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_separated() {
        assert_ne!(fnv1a64_parts(&[b"ab", b"c"]), fnv1a64_parts(&[b"a", b"bc"]));
        assert_eq!(fnv1a64_parts(&[b"x"]), fnv1a64_parts(&[b"x"]));
    }
}

//! upstream's `checkpointmanager/checksum`: the FNV-1a (32 bit) hash of what go-spew
//! prints of a checkpoint's data, which each manager's checkpoint prints its own way.

/// Go's `hash/fnv.New32a`.
pub fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

//! Dequantisation of ggml storage types to `f32`, following ggml's reference
//! `dequantize_row_*` functions (`ggml/src/ggml-quants.c`).
//!
//! Each block type packs a fixed number of consecutive values of one row (ggml rows are the
//! fastest-varying dimension, so a block never straddles two rows):
//!
//! | type | values | bytes | layout | value |
//! |---|---|---|---|---|
//! | Q8_0 | 32 | 34 | `f16 d, 32 × i8 q` | `d·q` |
//! | Q4_0 | 32 | 18 | `f16 d, 16 bytes` | `d·(q − 8)` |
//! | Q4_1 | 32 | 20 | `f16 d, f16 m, 16 bytes` | `d·q + m` |
//! | Q5_0 | 32 | 22 | `f16 d, u32 qh, 16 bytes` | `d·(q − 16)` |
//! | Q5_1 | 32 | 24 | `f16 d, f16 m, u32 qh, 16 bytes` | `d·q + m` |
//! | Q4_K | 256 | 144 | `f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes` | `d·sc·q − dmin·m` |
//! | Q6_K | 256 | 210 | `128 bytes low 4 bits, 64 bytes high 2 bits, 16 × i8 scales, f16 d` | `d·sc·(q − 32)` |
//!
//! In the 4-bit types the low nibbles of the 16 bytes are values 0–15 and the high nibbles
//! values 16–31 (not interleaved); Q5 types take bit `j` of `qh` as bit 4 of value `j`.

use half::{bf16, f16};

use super::ggml_type::GgmlType;

/// The ggml types [`dequantize`] handles, by name.
pub const SUPPORTED: &[&str] = &["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"];

/// Why [`dequantize`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DequantError {
    /// The type is not one of [`SUPPORTED`].
    Unsupported,
    /// `bytes` does not hold exactly the blocks that `out` asks for.
    Length {
        /// Bytes that `out.len()` values need.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
}

/// Whether [`dequantize`] handles `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    ty.name().is_some_and(|n| SUPPORTED.contains(&n))
}

/// Decode `out.len()` values of type `ty` from `bytes`, which must hold exactly their blocks.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    if !is_supported(ty) {
        return Err(DequantError::Unsupported);
    }
    let (block, block_bytes) = ty.block_layout().ok_or(DequantError::Unsupported)?;
    let expected = (out.len() / block) * block_bytes;
    if !out.len().is_multiple_of(block) || bytes.len() != expected {
        return Err(DequantError::Length { expected, got: bytes.len() });
    }
    let blocks = bytes.chunks_exact(block_bytes).zip(out.chunks_exact_mut(block));
    match ty {
        GgmlType::F32 => blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = f16::from_le_bytes([b[0], b[1]]).to_f32()),
        GgmlType::BF16 => blocks.for_each(|(b, y)| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| q5_1(b, y)),
        GgmlType::Q4_K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q6_K => blocks.for_each(|(b, y)| q6_k(b, y)),
        _ => return Err(DequantError::Unsupported),
    }
    Ok(())
}

fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `{f16 d, i8 q[32]}`, `y = d·q`.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = d * f32::from(q as i8);
    }
}

/// `{f16 d, u8 qs[16]}`, `y[j] = d·(lo(qs[j]) − 8)`, `y[j+16] = d·(hi(qs[j]) − 8)`.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * (f32::from(q & 0x0f) - 8.0);
        y[j + 16] = d * (f32::from(q >> 4) - 8.0);
    }
}

/// `{f16 d, f16 m, u8 qs[16]}`, `y[j] = d·lo(qs[j]) + m`, `y[j+16] = d·hi(qs[j]) + m`.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = d * f32::from(q & 0x0f) + m;
        y[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// The 5-bit values of a Q5 block: nibbles of `qs` plus bit `j` (value `j`) or `j + 16` of `qh`.
fn q5_values(qh: u32, qs: &[u8]) -> impl Iterator<Item = (usize, f32, f32)> + '_ {
    qs.iter().enumerate().map(move |(j, &q)| {
        let hi0 = ((qh >> j) << 4) & 0x10;
        let hi1 = (qh >> (j + 12)) & 0x10;
        (j, (u32::from(q & 0x0f) | hi0) as f32, (u32::from(q >> 4) | hi1) as f32)
    })
}

/// `{f16 d, u32 qh, u8 qs[16]}`, `y = d·(q − 16)`.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, x0, x1) in q5_values(qh, &b[6..22]) {
        y[j] = d * (x0 - 16.0);
        y[j + 16] = d * (x1 - 16.0);
    }
}

/// `{f16 d, f16 m, u32 qh, u8 qs[16]}`, `y = d·q + m`.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (j, x0, x1) in q5_values(qh, &b[8..24]) {
        y[j] = d * x0 + m;
        y[j + 16] = d * x1 + m;
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// `{f16 d, f16 dmin, u8 scales[12], u8 qs[128]}`: 8 sub-blocks of 32; each 32 bytes of `qs`
/// give one sub-block in the low nibbles and the next in the high nibbles.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    for (chunk, (qs, y)) in b[16..144].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
        for (l, &q) in qs.iter().enumerate() {
            y[l] = d1 * f32::from(q & 0x0f) - m1;
            y[l + 32] = d2 * f32::from(q >> 4) - m2;
        }
    }
}

/// `{u8 ql[128], u8 qh[64], i8 scales[16], f16 d}`: two halves of 128 values, each from 64
/// bytes of `ql`, 32 of `qh` and 8 scales (one per 16 values).
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = half(b, 208);
    for half_i in 0..2 {
        let ql = &b[half_i * 64..half_i * 64 + 64];
        let qh = &b[128 + half_i * 32..128 + half_i * 32 + 32];
        let sc = &b[192 + half_i * 8..192 + half_i * 8 + 8];
        let y = &mut y[half_i * 128..half_i * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            let s = |k: usize| d * f32::from(sc[is + k] as i8);
            y[l] = s(0) * q1 as f32;
            y[l + 32] = s(2) * q2 as f32;
            y[l + 64] = s(4) * q3 as f32;
            y[l + 96] = s(6) * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_1_nibble_order_and_offset() {
        // d = 0.5, m = -1; byte j holds q = j (low) and 15 - j (high).
        let mut b = Vec::new();
        b.extend(h(0.5));
        b.extend(h(-1.0));
        b.extend((0u8..16).map(|j| j | ((15 - j) << 4)));
        let mut y = [0.0; 32];
        dequantize(GgmlType::Q4_1, &b, &mut y).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], 0.5 * j as f32 - 1.0);
            assert_eq!(y[j + 16], 0.5 * (15 - j) as f32 - 1.0);
        }
    }

    #[test]
    fn q5_high_bits() {
        // Q5_0 with d = 1: qs all zero, qh sets bit 4 of values 0 and 17 only.
        let mut b = Vec::new();
        b.extend(h(1.0));
        b.extend((1u32 | (1 << 17)).to_le_bytes());
        b.extend([0u8; 16]);
        let mut y = [0.0; 32];
        dequantize(GgmlType::Q5_0, &b, &mut y).unwrap();
        let want: Vec<f32> = (0..32).map(|j| if j == 0 || j == 17 { 0.0 } else { -16.0 }).collect();
        assert_eq!(y.to_vec(), want);
    }

    #[test]
    fn q4_k_scales() {
        // d = 1, dmin = 1, sub-block 0: scale 2, min 3; sub-block 1: scale 1, min 0; qs = 5 | 7<<4.
        let mut b = vec![0u8; 144];
        b[0..2].copy_from_slice(&h(1.0));
        b[2..4].copy_from_slice(&h(1.0));
        b[4] = 2; // scale 0
        b[5] = 1; // scale 1
        b[8] = 3; // min 0
        b[16..48].fill(5 | (7 << 4));
        let mut y = [0.0; 256];
        dequantize(GgmlType::Q4_K, &b, &mut y).unwrap();
        assert_eq!(y[0], 2.0 * 5.0 - 3.0);
        assert_eq!(y[32], 7.0);
        assert_eq!(y[64], 0.0);
    }

    #[test]
    fn q6_k_layout() {
        // d = 0.25, all scales 2; value 0: q = 1 | 2<<4 = 33 → 0.25·2·1; value 96: hi nibble 0
        // of ql[32] and bits 6-7 of qh[0] = 0 → q − 32 = −32.
        let mut b = vec![0u8; 210];
        b[0] = 1;
        b[128] = 2;
        b[192..208].fill(2);
        b[208..210].copy_from_slice(&h(0.25));
        let mut y = [0.0; 256];
        dequantize(GgmlType::Q6_K, &b, &mut y).unwrap();
        assert_eq!(y[0], 0.5);
        assert_eq!(y[96], 0.25 * 2.0 * -32.0);
    }

    #[test]
    fn rejects_wrong_lengths_and_types() {
        let mut y = [0.0; 32];
        assert_eq!(dequantize(GgmlType::Q8_0, &[0; 33], &mut y), Err(DequantError::Length { expected: 34, got: 33 }));
        assert_eq!(dequantize(GgmlType(10), &[0; 84], &mut [0.0; 256]), Err(DequantError::Unsupported));
        assert_eq!(dequantize(GgmlType(999), &[], &mut []), Err(DequantError::Unsupported));
    }
}

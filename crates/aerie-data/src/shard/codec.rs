//! Element conversion between caller slices and little-endian safetensors bytes. Reading tries a
//! zero-copy cast first (shards written by the `safetensors` libraries keep every tensor aligned
//! to its element size) and falls back to a copy, so unaligned files from other writers still
//! read correctly, only slower.

use std::borrow::Cow;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::encoding::FloatDtype;
use super::encoding::{self, HiddenDtype};
use super::input::HiddenInput;

/// Append hidden rows in any encoding: codes to `codes`, and for the scaled encodings one scale
/// per `group` values to `scales`. On a value that is not finite returns its index (the caller
/// truncates both buffers).
pub(crate) fn encode_hidden(
    input: HiddenInput<'_>,
    dtype: HiddenDtype,
    group: usize,
    codes: &mut Vec<u8>,
    scales: &mut Vec<f32>,
) -> Result<(), usize> {
    match dtype.float() {
        Some(float) => encode_floats(input, float, codes),
        None => encoding::encode_scaled(input, dtype, group, codes, scales),
    }
}

/// Decode hidden rows in any encoding into `out` (`out.len()` values); `scales` are the raw
/// little-endian f32 scale bytes of the same rows (empty for the plain floats).
pub(crate) fn decode_hidden(codes: &[u8], scales: &[u8], dtype: HiddenDtype, group: usize, out: &mut [f32]) {
    match dtype.float() {
        Some(float) => decode_floats(codes, float, out),
        None => encoding::decode_scaled(codes, &f32s(scales), dtype, group, out),
    }
}

/// Append `input` to `out` as `dtype`. On a value that is not finite after conversion (a NaN
/// from the engine, or an overflow of the f16 range) returns its index; `out` may then hold a
/// partial append, which the caller truncates.
pub(crate) fn encode_floats(input: HiddenInput<'_>, dtype: FloatDtype, out: &mut Vec<u8>) -> Result<(), usize> {
    fn put<T: Copy, const N: usize>(
        values: &[T],
        out: &mut Vec<u8>,
        convert: impl Fn(T) -> Option<[u8; N]>,
    ) -> Result<(), usize> {
        out.reserve(values.len() * N);
        for (i, &v) in values.iter().enumerate() {
            out.extend_from_slice(&convert(v).ok_or(i)?);
        }
        Ok(())
    }
    let f32_ok = |v: f32| v.is_finite().then_some(v);
    match (input, dtype) {
        (HiddenInput::F32(v), FloatDtype::F32) => put(v, out, |x| f32_ok(x).map(f32::to_le_bytes)),
        (HiddenInput::F32(v), FloatDtype::F16) => put(v, out, |x| to_f16(x).map(f16::to_le_bytes)),
        (HiddenInput::F32(v), FloatDtype::BF16) => put(v, out, |x| to_bf16(x).map(bf16::to_le_bytes)),
        (HiddenInput::F16(v), FloatDtype::F16) => put(v, out, |x| x.is_finite().then(|| x.to_le_bytes())),
        (HiddenInput::BF16(v), FloatDtype::BF16) => put(v, out, |x| x.is_finite().then(|| x.to_le_bytes())),
        (HiddenInput::F16(v), dtype) => encode_via_f32(v.iter().map(|x| x.to_f32()), dtype, out),
        (HiddenInput::BF16(v), dtype) => encode_via_f32(v.iter().map(|x| x.to_f32()), dtype, out),
    }
}

fn encode_via_f32(values: impl Iterator<Item = f32>, dtype: FloatDtype, out: &mut Vec<u8>) -> Result<(), usize> {
    for (i, v) in values.enumerate() {
        let ok = match dtype {
            FloatDtype::F32 => v.is_finite().then(|| out.extend_from_slice(&v.to_le_bytes())),
            FloatDtype::F16 => to_f16(v).map(|h| out.extend_from_slice(&h.to_le_bytes())),
            FloatDtype::BF16 => to_bf16(v).map(|h| out.extend_from_slice(&h.to_le_bytes())),
        };
        ok.ok_or(i)?;
    }
    Ok(())
}

fn to_f16(v: f32) -> Option<f16> {
    let h = f16::from_f32(v);
    h.is_finite().then_some(h)
}

fn to_bf16(v: f32) -> Option<bf16> {
    let h = bf16::from_f32(v);
    h.is_finite().then_some(h)
}

/// Decode `bytes` of `dtype` into `out`; `out.len()` must equal the element count.
pub(crate) fn decode_floats(bytes: &[u8], dtype: FloatDtype, out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), out.len() * dtype.size());
    match dtype {
        FloatDtype::F32 => match bytemuck::try_cast_slice::<u8, f32>(bytes) {
            Ok(values) => out.copy_from_slice(values),
            Err(_) => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        },
        FloatDtype::F16 => match bytemuck::try_cast_slice::<u8, f16>(bytes) {
            Ok(values) => values.convert_to_f32_slice(out),
            Err(_) => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        },
        FloatDtype::BF16 => match bytemuck::try_cast_slice::<u8, bf16>(bytes) {
            Ok(values) => values.convert_to_f32_slice(out),
            Err(_) => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        },
    }
}

/// `bytes` as f32 values, borrowed when aligned.
pub(crate) fn f32s(bytes: &[u8]) -> Cow<'_, [f32]> {
    match bytemuck::try_cast_slice::<u8, f32>(bytes) {
        Ok(values) => Cow::Borrowed(values),
        Err(_) => Cow::Owned(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
    }
}

/// `bytes` as i32 values, borrowed when aligned.
pub(crate) fn i32s(bytes: &[u8]) -> Cow<'_, [i32]> {
    match bytemuck::try_cast_slice::<u8, i32>(bytes) {
        Ok(values) => Cow::Borrowed(values),
        Err(_) => Cow::Owned(bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
    }
}

/// `bytes` as i64 values (always copied: only offsets and ids, read once at open).
pub(crate) fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes.chunks_exact(8).map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()
}

/// Little-endian bytes of an i32 slice.
pub(crate) fn i32_bytes(values: &[i32]) -> &[u8] {
    bytemuck::cast_slice(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 lies halfway between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa (1.0).
        let halfway = 1.0 + 2f32.powi(-8);
        let above = 1.0 + 2f32.powi(-8) + 2f32.powi(-20);
        let mut out = Vec::new();
        encode_floats(HiddenInput::F32(&[halfway, above]), FloatDtype::BF16, &mut out).unwrap();
        let mut back = [0f32; 2];
        decode_floats(&out, FloatDtype::BF16, &mut back);
        assert_eq!(back, [1.0, 1.0 + 2f32.powi(-7)]);
    }

    #[test]
    fn non_finite_values_are_reported_by_index() {
        let mut out = Vec::new();
        let values = [1.0, f32::NAN];
        assert_eq!(encode_floats(HiddenInput::F32(&values), FloatDtype::F32, &mut out), Err(1));
        let big = [0.5, 1.0, 70_000.0];
        assert_eq!(encode_floats(HiddenInput::F32(&big), FloatDtype::F16, &mut out), Err(2));
        let bf = [bf16::from_f32(2.0), bf16::INFINITY];
        assert_eq!(encode_floats(HiddenInput::BF16(&bf), FloatDtype::F32, &mut out), Err(1));
    }

    #[test]
    fn conversions_between_all_dtypes() {
        let values = [0.0f32, -1.5, 3.25, 1e-3];
        let as_bf16: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
        let as_f16: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
        for input in [HiddenInput::F32(&values), HiddenInput::F16(&as_f16), HiddenInput::BF16(&as_bf16)] {
            for dtype in [FloatDtype::F32, FloatDtype::F16, FloatDtype::BF16] {
                let mut out = Vec::new();
                encode_floats(input, dtype, &mut out).unwrap();
                assert_eq!(out.len(), values.len() * dtype.size());
                let mut back = [0f32; 4];
                decode_floats(&out, dtype, &mut back);
                for (b, v) in back.iter().zip(values) {
                    assert!((b - v).abs() <= v.abs() * 1e-2, "{input:?} {dtype}: {b} vs {v}");
                }
            }
        }
    }

    #[test]
    fn unaligned_reads_fall_back_to_copies() {
        // Backed by u64 so that byte 1 is certainly misaligned for 4- and 2-byte elements.
        let mut storage = [0u64; 4];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut storage);
        let values = [1.0f32, -2.0, 0.5];
        for (i, v) in values.iter().enumerate() {
            bytes[1 + 4 * i..5 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        let unaligned = &bytes[1..13];
        assert!(matches!(f32s(unaligned), Cow::Owned(_)));
        assert_eq!(&*f32s(unaligned), &values);
        let mut out = [0f32; 3];
        decode_floats(unaligned, FloatDtype::F32, &mut out);
        assert_eq!(out, values);

        let ids = [7i32, -1, 1 << 20];
        for (i, v) in ids.iter().enumerate() {
            bytes[1 + 4 * i..5 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        assert!(matches!(i32s(&bytes[1..13]), Cow::Owned(_)));
        assert_eq!(&*i32s(&bytes[1..13]), &ids);

        for (i, v) in [1.0f32, 2.0].iter().enumerate() {
            bytes[1 + 2 * i..3 + 2 * i].copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
        }
        let mut out = [0f32; 2];
        decode_floats(&bytes[1..5], FloatDtype::BF16, &mut out);
        assert_eq!(out, [1.0, 2.0]);
    }
}

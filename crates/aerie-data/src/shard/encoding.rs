//! Storage encodings of the hidden-state tensors (`aux_hidden`, `final_hidden`): the plain float
//! types of format 1 and the compact, scaled encodings of format 2 (docs/shard-format.md §3.1).
//!
//! Why scaled encodings: a captured token of Kimi-K2 costs 3 × 7168 × 2 bytes of aux features in
//! bf16, and disk, not GPUs, bounds how much data a drafter sees. Residual streams have a
//! dynamic range that varies by orders of magnitude between layers and tokens (massive
//! activations), so a single global scale wastes the few bits an 8- or 4-bit code has; a scale
//! per token and layer (FP8) or per 32 values (int4) follows the range where it is.
//!
//! Both encodings are symmetric and round to nearest (ties to even), so their error is bounded
//! by half a code step at the row's own scale; the bounds are documented on
//! [`HiddenDtype::error_bound`] and tested against f32 in this module and in
//! `tests/shard/encodings.rs`.

use std::fmt;
use std::str::FromStr;

use safetensors::Dtype;

use super::input::HiddenInput;
use crate::MetadataError;

/// The format string of datasets stored in a plain float (`bf16`, `f16`, `f32`): readable by
/// every aerie-shard reader, so writers keep using it for those.
pub const FORMAT: &str = "aerie-shard/1";

/// The format string of datasets stored in a scaled encoding (`fp8-e4m3`, `int4`). A
/// format-1 reader must refuse them: read as plain tensors, their codes without the scales are
/// wrong values, not an error.
pub const FORMAT_V2: &str = "aerie-shard/2";

/// Storage type of the hidden-state tensors (and of top-k log-probs, which take F16 or F32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FloatDtype {
    /// IEEE float32.
    F32,
    /// IEEE float16.
    F16,
    /// bfloat16: what capture engines usually run in, and half the bytes of f32.
    BF16,
}

impl FloatDtype {
    /// The metadata spelling: `f32`, `f16` or `bf16`.
    pub fn as_str(self) -> &'static str {
        match self {
            FloatDtype::F32 => "f32",
            FloatDtype::F16 => "f16",
            FloatDtype::BF16 => "bf16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FloatDtype::F32 => 4,
            FloatDtype::F16 | FloatDtype::BF16 => 2,
        }
    }

    pub(crate) fn from_safetensors(dtype: safetensors::Dtype) -> Option<Self> {
        match dtype {
            safetensors::Dtype::F32 => Some(FloatDtype::F32),
            safetensors::Dtype::F16 => Some(FloatDtype::F16),
            safetensors::Dtype::BF16 => Some(FloatDtype::BF16),
            _ => None,
        }
    }
}

impl fmt::Display for FloatDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FloatDtype {
    type Err = MetadataError;

    fn from_str(s: &str) -> std::result::Result<Self, MetadataError> {
        match s {
            "f32" => Ok(FloatDtype::F32),
            "f16" => Ok(FloatDtype::F16),
            "bf16" => Ok(FloatDtype::BF16),
            other => Err(MetadataError::new("dtype", format!("`{other}` is not one of `f32`, `f16`, `bf16`"))),
        }
    }
}

/// Values per scale of the `int4` encoding: 32 consecutive values of a row, never spanning two
/// captured layers (Ht must be a multiple of 32). 32 (as GGML's Q4_0) keeps a group inside one
/// cache line of f32 and costs 4/32 bytes of scale per value.
pub const INT4_GROUP: usize = 32;

/// Largest finite FP8 E4M3 magnitude (OCP `E4M3FN`: no infinities, S.1111.111 is NaN).
pub const FP8_E4M3_MAX: f32 = 448.0;

/// Largest int4 code magnitude: codes are symmetric, −7..=7 (−8 is never written).
const INT4_MAX: f32 = 7.0;

/// Storage of `aux_hidden` and `final_hidden`, the metadata `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HiddenDtype {
    /// IEEE float32.
    F32,
    /// IEEE float16.
    F16,
    /// bfloat16: what capture engines usually run in, and half the bytes of f32.
    BF16,
    /// FP8 E4M3 (OCP `E4M3FN`) codes, one f32 scale per token and captured layer
    /// (`<tensor>_scales` [T, A]; [T, 1] for `final_hidden`): value = code × scale.
    Fp8E4m3,
    /// Symmetric int4 codes (−7..=7, stored as code + 8 in a nibble, two per byte, the even
    /// value in the low nibble), one f32 scale per [`INT4_GROUP`] values of a row: value =
    /// code × scale.
    Int4,
}

impl HiddenDtype {
    /// Every encoding, in the order the docs list them.
    pub const ALL: [HiddenDtype; 5] =
        [HiddenDtype::F32, HiddenDtype::F16, HiddenDtype::BF16, HiddenDtype::Fp8E4m3, HiddenDtype::Int4];

    /// The metadata spelling: `f32`, `f16`, `bf16`, `fp8-e4m3` or `int4`.
    pub fn as_str(self) -> &'static str {
        match self {
            HiddenDtype::F32 => "f32",
            HiddenDtype::F16 => "f16",
            HiddenDtype::BF16 => "bf16",
            HiddenDtype::Fp8E4m3 => "fp8-e4m3",
            HiddenDtype::Int4 => "int4",
        }
    }

    /// The plain float type, for the unscaled encodings.
    pub fn float(self) -> Option<FloatDtype> {
        match self {
            HiddenDtype::F32 => Some(FloatDtype::F32),
            HiddenDtype::F16 => Some(FloatDtype::F16),
            HiddenDtype::BF16 => Some(FloatDtype::BF16),
            HiddenDtype::Fp8E4m3 | HiddenDtype::Int4 => None,
        }
    }

    /// Whether the tensors come with a `_scales` tensor (the compact encodings of format 2).
    pub fn is_scaled(self) -> bool {
        self.float().is_none()
    }

    /// The safetensors dtype of the stored codes.
    pub fn to_safetensors(self) -> Dtype {
        match self {
            HiddenDtype::F32 => Dtype::F32,
            HiddenDtype::F16 => Dtype::F16,
            HiddenDtype::BF16 => Dtype::BF16,
            HiddenDtype::Fp8E4m3 => Dtype::F8_E4M3,
            HiddenDtype::Int4 => Dtype::U8,
        }
    }

    /// Stored columns of a row of `width` values (int4 packs two values per byte).
    pub fn stored_width(self, width: usize) -> usize {
        match self {
            HiddenDtype::Int4 => width / 2,
            _ => width,
        }
    }

    /// Bytes of a stored row of `width` values, scales excluded.
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            HiddenDtype::F32 => 4 * width,
            HiddenDtype::F16 | HiddenDtype::BF16 => 2 * width,
            HiddenDtype::Fp8E4m3 => width,
            HiddenDtype::Int4 => width / 2,
        }
    }

    /// Values per scale, for a dataset of hidden size `hidden_size`: Ht for FP8 (a scale per
    /// token and layer), [`INT4_GROUP`] for int4, `None` for the plain floats.
    pub fn group(self, hidden_size: usize) -> Option<usize> {
        match self {
            HiddenDtype::Fp8E4m3 => Some(hidden_size),
            HiddenDtype::Int4 => Some(INT4_GROUP),
            _ => None,
        }
    }

    /// Scales per row of `width` values (0 for the plain floats).
    pub fn scales_per_row(self, width: usize, hidden_size: usize) -> usize {
        self.group(hidden_size).map_or(0, |g| width / g)
    }

    /// Bytes of one stored row of `width` values, scales included.
    pub fn row_bytes_with_scales(self, width: usize, hidden_size: usize) -> usize {
        self.row_bytes(width) + 4 * self.scales_per_row(width, hidden_size)
    }

    /// The documented bound on `|decoded − x|` for a value `x` of a group whose largest
    /// magnitude is `amax`, given x in f32 and a dataset of hidden size `hidden_size` (the group
    /// of FP8 is the whole layer row):
    ///
    /// - f32: 0; f16 and bf16: half an ulp of x (2^-11·|x| and 2^-8·|x|) plus the f16
    ///   subnormal step (2^-25) for tiny values.
    /// - fp8-e4m3: max(|x|/16, s/1024), s = amax/448: half of the 3-bit mantissa step, or
    ///   half the subnormal step 2^-9·s below 2^-6·s.
    /// - int4: s/2, s = amax/7.
    ///
    /// Each plus 2^-20·amax for the f32 arithmetic of scaling.
    pub fn error_bound(self, x: f32, amax: f32) -> f32 {
        let x = x.abs();
        let arith = amax * 2f32.powi(-20);
        match self {
            HiddenDtype::F32 => 0.0,
            HiddenDtype::F16 => x * 2f32.powi(-11) + 2f32.powi(-25),
            HiddenDtype::BF16 => x * 2f32.powi(-8),
            HiddenDtype::Fp8E4m3 => (x / 16.0).max(amax / FP8_E4M3_MAX / 1024.0) + arith,
            HiddenDtype::Int4 => amax / INT4_MAX / 2.0 + arith,
        }
    }

    /// The format version a dataset of this encoding must declare: `aerie-shard/1` for the plain
    /// floats (readable by every reader), `aerie-shard/2` for the scaled encodings, which a
    /// format-1 reader would misread as unscaled values.
    pub fn format(self) -> &'static str {
        if self.is_scaled() { FORMAT_V2 } else { FORMAT }
    }
}

impl fmt::Display for HiddenDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HiddenDtype {
    type Err = MetadataError;

    fn from_str(s: &str) -> std::result::Result<Self, MetadataError> {
        HiddenDtype::ALL.into_iter().find(|d| d.as_str() == s).ok_or_else(|| {
            MetadataError::new(
                "dtype",
                format!("`{s}` is not a known encoding (this build reads f32, f16, bf16, fp8-e4m3, int4)"),
            )
        })
    }
}

impl From<FloatDtype> for HiddenDtype {
    fn from(d: FloatDtype) -> Self {
        match d {
            FloatDtype::F32 => HiddenDtype::F32,
            FloatDtype::F16 => HiddenDtype::F16,
            FloatDtype::BF16 => HiddenDtype::BF16,
        }
    }
}

/// f32 value of every E4M3 code; NaN for the two NaN codes.
static FP8_E4M3_TO_F32: [f32; 256] = {
    let mut table = [0f32; 256];
    let mut b = 0;
    while b < 256 {
        let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((b >> 3) & 0xf) as i32;
        let m = (b & 7) as f32;
        let magnitude = if e == 0 {
            m / 512.0
        } else if e == 15 && b & 7 == 7 {
            f32::NAN
        } else {
            // (1 + m/8) · 2^(e-7), with the power built exactly (const context: no powi).
            let mut p = 1.0f32;
            let mut i = 0;
            while i < (e - 7).abs() {
                p *= 2.0;
                i += 1;
            }
            let p = if e >= 7 { p } else { 1.0 / p };
            (1.0 + m / 8.0) * p
        };
        table[b] = sign * magnitude;
        b += 1;
    }
    table
};

/// The E4M3 code nearest to `x` (ties to even), saturating at ±448. `x` must not be NaN.
pub(crate) fn f32_to_fp8_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    // Below the smallest normal 2^-6 the codes are m · 2^-9, m = 0..=7 (m = 8 is the code of 2^-6
    // itself, exponent field 1, so the arithmetic carries into the right code).
    if a < 2f32.powi(-6) {
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // Round the 23-bit mantissa to 3 bits, ties to even, letting a carry bump the exponent.
    let bits = a.to_bits();
    let rounded = (bits + ((1 << 19) - 1) + ((bits >> 20) & 1)) & !((1u32 << 20) - 1);
    let e = ((rounded >> 23) as i32) - 127;
    let m = (rounded >> 20) & 7;
    if e > 8 || (e == 8 && m == 7) || !a.is_finite() {
        return sign | 0x7e;
    }
    sign | (((e + 7) as u8) << 3) | m as u8
}

/// The value of an E4M3 code.
#[inline]
pub(crate) fn fp8_e4m3_to_f32(code: u8) -> f32 {
    FP8_E4M3_TO_F32[code as usize]
}

/// A group's scale: amax / qmax, never 0 (an all-zero group gets the smallest normal scale and
/// decodes to zeros), so a stored scale of 0 always means a damaged file.
fn scale_for(amax: f32, qmax: f32) -> f32 {
    (amax / qmax).max(f32::MIN_POSITIVE)
}

/// Append `input` (rows of `width` values) to `codes`/`scales` in the scaled encoding `dtype`,
/// groups of `group` values. On a value that is not finite returns its index; the buffers may
/// then hold a partial append, which the caller truncates.
pub(crate) fn encode_scaled(
    input: HiddenInput<'_>,
    dtype: HiddenDtype,
    group: usize,
    codes: &mut Vec<u8>,
    scales: &mut Vec<f32>,
) -> Result<(), usize> {
    let n = input.len();
    let mut buf = vec![0f32; group];
    codes.reserve(dtype.row_bytes(n));
    scales.reserve(n / group);
    for start in (0..n).step_by(group) {
        let values = &mut buf[..group.min(n - start)];
        match input {
            HiddenInput::F32(v) => values.copy_from_slice(&v[start..start + values.len()]),
            HiddenInput::F16(v) => {
                for (o, x) in values.iter_mut().zip(&v[start..]) {
                    *o = x.to_f32();
                }
            }
            HiddenInput::BF16(v) => {
                for (o, x) in values.iter_mut().zip(&v[start..]) {
                    *o = x.to_f32();
                }
            }
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(start + i);
        }
        let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        match dtype {
            HiddenDtype::Fp8E4m3 => {
                let s = scale_for(amax, FP8_E4M3_MAX);
                codes.extend(values.iter().map(|&v| f32_to_fp8_e4m3(v / s)));
                scales.push(s);
            }
            HiddenDtype::Int4 => {
                let s = scale_for(amax, INT4_MAX);
                let nibble = |v: f32| ((v / s).round_ties_even().clamp(-INT4_MAX, INT4_MAX) as i32 + 8) as u8;
                codes.extend(values.chunks_exact(2).map(|p| nibble(p[0]) | (nibble(p[1]) << 4)));
                scales.push(s);
            }
            _ => unreachable!("encode_scaled is only called for the scaled encodings"),
        }
    }
    Ok(())
}

/// Decode rows of a scaled encoding: `codes` holds `out.len()` values in `dtype`, `scales` one
/// scale per `group` values.
pub(crate) fn decode_scaled(codes: &[u8], scales: &[f32], dtype: HiddenDtype, group: usize, out: &mut [f32]) {
    debug_assert_eq!(scales.len() * group, out.len());
    match dtype {
        HiddenDtype::Fp8E4m3 => {
            for ((o, c), &s) in out.chunks_exact_mut(group).zip(codes.chunks_exact(group)).zip(scales) {
                for (o, &c) in o.iter_mut().zip(c) {
                    *o = fp8_e4m3_to_f32(c) * s;
                }
            }
        }
        HiddenDtype::Int4 => {
            for ((o, c), &s) in out.chunks_exact_mut(group).zip(codes.chunks_exact(group / 2)).zip(scales) {
                for (o, &c) in o.chunks_exact_mut(2).zip(c) {
                    o[0] = ((c & 0xf) as i32 - 8) as f32 * s;
                    o[1] = ((c >> 4) as i32 - 8) as f32 * s;
                }
            }
        }
        _ => unreachable!("decode_scaled is only called for the scaled encodings"),
    }
}

/// The first scale that is not positive and finite, with its index.
pub(crate) fn bad_scale(scales: &[f32]) -> Option<(usize, f32)> {
    scales.iter().position(|s| !(s.is_finite() && *s > 0.0)).map(|i| (i, scales[i]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: the nearest E4M3 value (ties to the even code), saturating.
    fn nearest_code(x: f32) -> u8 {
        let mut best = (f32::INFINITY, 0u8);
        for c in 0..=255u8 {
            let v = fp8_e4m3_to_f32(c);
            if v.is_nan() || (v == 0.0 && v.is_sign_negative() != x.is_sign_negative()) {
                continue;
            }
            let d = (v - x).abs();
            if d < best.0 || (d == best.0 && c & 1 == 0) {
                best = (d, c);
            }
        }
        best.1
    }

    #[test]
    fn fp8_table_matches_the_ocp_values() {
        assert_eq!(fp8_e4m3_to_f32(0x00), 0.0);
        assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(fp8_e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(fp8_e4m3_to_f32(0x38), 1.0);
        assert_eq!(fp8_e4m3_to_f32(0x7e), 448.0);
        assert_eq!(fp8_e4m3_to_f32(0xfe), -448.0);
        assert!(fp8_e4m3_to_f32(0x7f).is_nan() && fp8_e4m3_to_f32(0xff).is_nan());
        for c in 0..=255u8 {
            let v = fp8_e4m3_to_f32(c);
            if !v.is_nan() && c != 0x80 {
                assert_eq!(f32_to_fp8_e4m3(v), c, "code {c:#04x} = {v}");
            }
        }
    }

    #[test]
    fn fp8_rounds_to_the_nearest_code() {
        let mut x = 1e-5f32;
        let mut checked = 0;
        while x < 600.0 {
            for v in [x, -x, x * 1.0001, x * 0.9999] {
                assert_eq!(f32_to_fp8_e4m3(v), nearest_code(v.clamp(-448.0, 448.0)), "{v}");
            }
            x *= 1.003;
            checked += 1;
        }
        assert!(checked > 3000);
        // Ties go to the even code: 1 + 1/16 lies halfway between 1 (0x38) and 1.125 (0x39).
        assert_eq!(f32_to_fp8_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_fp8_e4m3(1.1875), 0x3a);
    }

    fn round_trip(dtype: HiddenDtype, values: &[f32], group: usize) -> (Vec<f32>, Vec<f32>) {
        let (mut codes, mut scales) = (Vec::new(), Vec::new());
        encode_scaled(HiddenInput::F32(values), dtype, group, &mut codes, &mut scales).unwrap();
        assert_eq!(codes.len(), dtype.row_bytes(values.len()));
        assert_eq!(scales.len(), values.len() / group);
        let mut out = vec![0f32; values.len()];
        decode_scaled(&codes, &scales, dtype, group, &mut out);
        (out, scales)
    }

    #[test]
    fn scaled_encodings_stay_within_their_bound() {
        // Residual-stream-like rows: mostly O(1) values with a few massive outliers.
        let mut rng = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let values: Vec<f32> =
            (0..4096).map(|i| if i % 997 == 0 { 300.0 * next() } else { next() * next().abs().powi(3) }).collect();
        for (dtype, group) in [(HiddenDtype::Fp8E4m3, 1024), (HiddenDtype::Int4, INT4_GROUP)] {
            let (out, _) = round_trip(dtype, &values, group);
            for (g, (xs, ys)) in values.chunks(group).zip(out.chunks(group)).enumerate() {
                let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (j, (&x, &y)) in xs.iter().zip(ys).enumerate() {
                    let bound = dtype.error_bound(x, amax);
                    assert!((x - y).abs() <= bound, "{dtype} group {g}[{j}]: {x} → {y}, bound {bound}");
                }
            }
        }
    }

    #[test]
    fn zero_groups_get_a_positive_scale_and_decode_to_zero() {
        for (dtype, group) in [(HiddenDtype::Fp8E4m3, 64), (HiddenDtype::Int4, INT4_GROUP)] {
            let (out, scales) = round_trip(dtype, &[0.0; 64], group);
            assert!(out.iter().all(|&v| v == 0.0));
            assert!(bad_scale(&scales).is_none(), "{scales:?}");
        }
    }

    #[test]
    fn non_finite_input_is_reported_by_index() {
        let mut values = vec![1.0f32; 64];
        values[40] = f32::INFINITY;
        let (mut codes, mut scales) = (Vec::new(), Vec::new());
        let r = encode_scaled(HiddenInput::F32(&values), HiddenDtype::Int4, 32, &mut codes, &mut scales);
        assert_eq!(r, Err(40));
        assert_eq!(bad_scale(&[1.0, 0.0]), Some((1, 0.0)));
        assert!(bad_scale(&[f32::NAN]).is_some() && bad_scale(&[-1.0]).is_some());
    }

    #[test]
    fn spellings() {
        for d in HiddenDtype::ALL {
            assert_eq!(d.as_str().parse::<HiddenDtype>().unwrap(), d);
        }
        let e = "fp4".parse::<HiddenDtype>().unwrap_err();
        assert_eq!(e.key, "dtype");
        assert_eq!(HiddenDtype::Int4.row_bytes_with_scales(7168 * 3, 7168), 3 * 7168 / 2 + 4 * 3 * 7168 / 32);
        assert_eq!(HiddenDtype::Fp8E4m3.row_bytes_with_scales(7168 * 3, 7168), 3 * 7168 + 12);
    }
}

//! Each supported storage type, read from a GGUF file, against hand-computed values.

use aerie_hub::gguf::{GgmlType, GgufFile, Value, tensor_to_f32};
use half::{bf16, f16};

use crate::writer::{GgufWriter, s};

fn h(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

/// One file holding one tensor of each type; returns each tensor's values.
fn read_back(tensors: Vec<(&str, Vec<u64>, GgmlType, Vec<u8>)>) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    let mut w = GgufWriter::new();
    w.kv("general.architecture", s("llama"));
    for (name, dims, ty, data) in &tensors {
        w.tensor(name, dims, *ty, data.clone());
    }
    w.write(&path);
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get("general.architecture"), Some(&Value::String("llama".into())));
    tensors.iter().map(|(name, ..)| tensor_to_f32(&g, g.tensor(name).unwrap()).unwrap()).collect()
}

#[test]
fn float_types() {
    let f32s: Vec<u8> = [1.5f32, -2.25, 0.0, 1e-3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16s: Vec<u8> = [0.5f32, -3.0, 65504.0, 0.000061035156].iter().flat_map(|&v| h(v)).collect();
    let bf16s: Vec<u8> =
        [1.0f32, -0.5, 3.0e38, 0.15625].iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
    let got = read_back(vec![
        ("a", vec![4], GgmlType::F32, f32s),
        ("b", vec![2, 2], GgmlType::F16, f16s),
        ("c", vec![4], GgmlType::BF16, bf16s),
    ]);
    assert_eq!(got[0], [1.5, -2.25, 0.0, 1e-3]);
    assert_eq!(got[1], [0.5, -3.0, 65504.0, 0.000061035156]);
    assert_eq!(got[2], [1.0, -0.5, bf16::from_f32(3.0e38).to_f32(), 0.15625]);
}

#[test]
fn q8_0() {
    // Two blocks: d = 0.5 with q = -16..16, d = -2 with q = i8::MIN, i8::MAX, 0, ...
    let mut b = Vec::new();
    b.extend(h(0.5));
    b.extend((-16i8..16).map(|q| q as u8));
    b.extend(h(-2.0));
    let mut q2 = [0i8; 32];
    q2[0] = i8::MIN;
    q2[1] = i8::MAX;
    b.extend(q2.iter().map(|&q| q as u8));
    let y = &read_back(vec![("w", vec![64], GgmlType::Q8_0, b)])[0];
    for (j, &v) in y[..32].iter().enumerate() {
        assert_eq!(v, 0.5 * (j as f32 - 16.0));
    }
    assert_eq!(y[32], 256.0);
    assert_eq!(y[33], -254.0);
    assert!(y[34..].iter().all(|&v| v == 0.0));
}

#[test]
fn q4_0() {
    // d = 0.25; byte j: low nibble j, high nibble 15 - j.  w = d·(q − 8).
    let mut b = Vec::new();
    b.extend(h(0.25));
    b.extend((0u8..16).map(|j| j | ((15 - j) << 4)));
    let y = &read_back(vec![("w", vec![32], GgmlType::Q4_0, b)])[0];
    assert_eq!(y[0], -2.0); // q = 0
    assert_eq!(y[8], 0.0); // q = 8
    assert_eq!(y[15], 1.75); // q = 15
    assert_eq!(y[16], 1.75); // high nibble of byte 0: 15
    assert_eq!(y[31], -2.0); // high nibble of byte 15: 0
}

#[test]
fn q4_1() {
    // d = 2, m = -3; byte j: low nibble (j + 1) % 16, high nibble j.  w = d·q + m.
    let mut b = Vec::new();
    b.extend(h(2.0));
    b.extend(h(-3.0));
    b.extend((0u8..16).map(|j| ((j + 1) % 16) | (j << 4)));
    // Second row: another block, d = 0.5, m = 1, all bytes 0xF0.
    b.extend(h(0.5));
    b.extend(h(1.0));
    b.extend([0xf0u8; 16]);
    let y = &read_back(vec![("w", vec![32, 2], GgmlType::Q4_1, b)])[0];
    let want: Vec<f32> = (0..16)
        .map(|j| 2.0 * ((j + 1) % 16) as f32 - 3.0)
        .chain((0..16).map(|j| 2.0 * j as f32 - 3.0))
        .chain(std::iter::repeat_n(1.0, 16))
        .chain(std::iter::repeat_n(8.5, 16))
        .collect();
    assert_eq!(y, &want);
}

#[test]
fn metadata_value_types() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.gguf");
    let mut w = GgufWriter::new();
    w.version = 2;
    w.alignment = 64;
    w.kv("general.alignment", Value::U32(64))
        .kv("u8", Value::U8(200))
        .kv("i8", Value::I8(-5))
        .kv("u16", Value::U16(60000))
        .kv("i16", Value::I16(-30000))
        .kv("i32", Value::I32(-7))
        .kv("f32", Value::F32(1e-5))
        .kv("bool", Value::Bool(true))
        .kv("u64", Value::U64(1 << 40))
        .kv("i64", Value::I64(-(1 << 40)))
        .kv("f64", Value::F64(0.125))
        .kv(
            "nested",
            Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(2)]), Value::Array(vec![Value::I32(3)])]),
        )
        .kv("empty", Value::Array(vec![]));
    w.tensor("t", &[2], GgmlType::F32, [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect());
    w.write(&path);
    let g = GgufFile::open(&path).unwrap();
    assert_eq!((g.version(), g.alignment()), (2, 64));
    assert_eq!(g.get_u64("u8").unwrap(), Some(200));
    assert_eq!(g.get("i16").and_then(Value::as_int), Some(-30000));
    assert_eq!(g.get_u64("i8").ok(), None, "a negative i8 is not a u64");
    assert_eq!(g.get_f64("f32").unwrap(), Some(1e-5), "f32 metadata widens via its shortest decimal");
    assert_eq!(g.get_bool("bool").unwrap(), Some(true));
    assert_eq!(g.get_u64("u64").unwrap(), Some(1 << 40));
    assert_eq!(g.get("i64").and_then(Value::as_int), Some(-(1 << 40)));
    assert_eq!(g.get_f64("f64").unwrap(), Some(0.125));
    assert_eq!(g.get("nested").and_then(Value::as_array).map(<[Value]>::len), Some(2));
    assert_eq!(g.get("empty"), Some(&Value::Array(vec![])));
    assert_eq!(g.metadata().len(), 13);
    assert_eq!(tensor_to_f32(&g, g.tensor("t").unwrap()).unwrap(), [1.0, 2.0]);
    assert!(g.get_str("u8").unwrap_err().to_string().contains("`u8` is a u8, expected a string"));
}

/// Q5_0, Q5_1, Q4_K and Q6_K against gguf-py 0.19's numpy dequantiser (`gguf.quants.dequantize`)
/// on two blocks of a fixed byte pattern `(37·i + 11) mod 256` with sane f16 scales patched in:
/// the sum, the sum of squares and the first and last three values.
#[test]
fn other_block_types_match_gguf_py() {
    use aerie_hub::gguf::dequant::dequantize;
    type Case = (GgmlType, &'static [(usize, f32)], f64, f64, [f32; 3], [f32; 3]);
    let cases: [Case; 4] = [
        (GgmlType::Q5_0, &[(0, 0.5)], -2.0, 1385.0, [4.5, -1.0, 1.5], [7.5, 0.5, 2.0]),
        (GgmlType::Q5_1, &[(0, 0.5), (2, -0.25)], 477.0, 4980.0, [9.25, 11.75, 14.25], [3.75, 5.25, 14.25]),
        (GgmlType::Q4_K, &[(0, 0.5), (2, 0.125)], 64344.0, 14177090.5, [164.125, -6.375, 71.125], [79.0, 160.0, 214.0]),
        (GgmlType::Q6_K, &[(208, 0.0625)], 340.0, 4085448.1875, [-89.4375, 106.0, 36.4375], [35.0, 125.0, -100.0]),
    ];
    for (ty, halves, sum, sum_sq, first, last) in cases {
        let (block, block_bytes) = ty.block_layout().unwrap();
        let mut b: Vec<u8> = (0..2 * block_bytes).map(|i| ((i * 37 + 11) % 256) as u8).collect();
        for &(at, v) in halves {
            for base in [0, block_bytes] {
                b[base + at..base + at + 2].copy_from_slice(&h(v));
            }
        }
        let mut y = vec![0.0; 2 * block];
        dequantize(ty, &b, &mut y).unwrap();
        let s: f64 = y.iter().map(|&v| f64::from(v)).sum();
        let s2: f64 = y.iter().map(|&v| f64::from(v).powi(2)).sum();
        assert_eq!((s, s2), (sum, sum_sq), "{ty}");
        assert_eq!(y[..3], first, "{ty}");
        assert_eq!(y[y.len() - 3..], last, "{ty}");
    }
}

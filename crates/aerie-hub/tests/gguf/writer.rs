//! A minimal GGUF v3 writer for tests, plus exact encoders for values on each quant type's grid
//! and a tiny llama model (tensors, hyperparameters, byte-level vocabulary) built with them.

use std::path::Path;

use aerie_hub::gguf::{GgmlType, Value};
use half::{bf16, f16};

/// One tensor to write: GGUF dims (fastest first), type id, raw bytes.
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
}

/// Builder for a GGUF file.
pub struct GgufWriter {
    pub version: u32,
    pub alignment: u64,
    pub kv: Vec<(String, Value)>,
    pub tensors: Vec<RawTensor>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self { version: 3, alignment: 32, kv: Vec::new(), tensors: Vec::new() }
    }

    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.kv.retain(|(k, _)| k != key);
        self.kv.push((key.to_string(), v));
        self
    }

    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors.push(RawTensor { name: name.to_string(), dims: dims.to_vec(), ty: ty.0, data });
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(b"GGUF");
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut b, k);
            b.extend(type_id(v).to_le_bytes());
            put_value(&mut b, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            put_str(&mut b, &t.name);
            b.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.ty.to_le_bytes());
            b.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).next_multiple_of(self.alignment);
        }
        let start = (b.len() as u64).next_multiple_of(self.alignment);
        for (t, off) in self.tensors.iter().zip(offsets) {
            b.resize((start + off) as usize, 0);
            b.extend(&t.data);
        }
        b
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.to_bytes()).unwrap();
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.extend(x.to_le_bytes()),
        Value::I8(x) => b.extend(x.to_le_bytes()),
        Value::U16(x) => b.extend(x.to_le_bytes()),
        Value::I16(x) => b.extend(x.to_le_bytes()),
        Value::U32(x) => b.extend(x.to_le_bytes()),
        Value::I32(x) => b.extend(x.to_le_bytes()),
        Value::F32(x) => b.extend(x.to_le_bytes()),
        Value::Bool(x) => b.push(u8::from(*x)),
        Value::String(s) => put_str(b, s),
        Value::Array(items) => {
            // Element type of an empty array: u8.
            b.extend(items.first().map_or(0, type_id).to_le_bytes());
            b.extend((items.len() as u64).to_le_bytes());
            for i in items {
                put_value(b, i);
            }
        }
        Value::U64(x) => b.extend(x.to_le_bytes()),
        Value::I64(x) => b.extend(x.to_le_bytes()),
        Value::F64(x) => b.extend(x.to_le_bytes()),
    }
}

pub fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

pub fn strs<S: AsRef<str>>(v: &[S]) -> Value {
    Value::Array(v.iter().map(|x| s(x.as_ref())).collect())
}

/// Deterministic pseudo-random integers in `0..n` (an LCG; tests need no rand crate).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn below(&mut self, n: u32) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % u64::from(n)) as u32
    }
}

/// The fixed scales the encoders below use, so that every generated value is exact.
pub const Q8_D: f32 = 0.25;
pub const Q4_D: f32 = 0.5;
pub const Q41_D: f32 = 0.25;
pub const Q41_M: f32 = -1.0;

/// Random values on `ty`'s grid (exactly representable after encoding).
pub fn grid_values(ty: GgmlType, n: usize, rng: &mut Lcg) -> Vec<f32> {
    (0..n)
        .map(|_| match ty {
            GgmlType::Q8_0 => Q8_D * (rng.below(255) as f32 - 127.0),
            GgmlType::Q4_0 => Q4_D * (rng.below(16) as f32 - 8.0),
            GgmlType::Q4_1 => Q41_D * rng.below(16) as f32 + Q41_M,
            _ => (rng.below(64) as f32 - 32.0) / 8.0,
        })
        .collect()
}

/// Encode values produced by [`grid_values`] (row-major, rows of a multiple of 32 for block types).
pub fn encode(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    let mut b = Vec::new();
    match ty {
        GgmlType::F32 => values.iter().for_each(|v| b.extend(v.to_le_bytes())),
        GgmlType::F16 => values.iter().for_each(|v| b.extend(f16::from_f32(*v).to_le_bytes())),
        GgmlType::BF16 => values.iter().for_each(|v| b.extend(bf16::from_f32(*v).to_le_bytes())),
        GgmlType::Q8_0 => {
            for block in values.chunks(32) {
                b.extend(f16::from_f32(Q8_D).to_le_bytes());
                b.extend(block.iter().map(|v| (v / Q8_D) as i8 as u8));
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            for block in values.chunks(32) {
                let code = |v: f32| (if ty == GgmlType::Q4_0 { v / Q4_D + 8.0 } else { (v - Q41_M) / Q41_D }) as u8;
                if ty == GgmlType::Q4_0 {
                    b.extend(f16::from_f32(Q4_D).to_le_bytes());
                } else {
                    b.extend(f16::from_f32(Q41_D).to_le_bytes());
                    b.extend(f16::from_f32(Q41_M).to_le_bytes());
                }
                b.extend((0..16).map(|j| code(block[j]) | (code(block[j + 16]) << 4)));
            }
        }
        other => panic!("test encoder: {other} not supported"),
    }
    b
}

/// GPT-2's `bytes_to_unicode`: the printable stand-in of every byte in byte-level BPE.
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        char::from(b)
    } else {
        let n = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + n).unwrap()
    }
}

/// llama.cpp's `permute(w, n_head)`, written as the brief states it, independently of the
/// crate: `w.reshape(n, 2, rows/n/2, cols).swapaxes(1, 2).reshape(rows, cols)`.
pub fn llama_cpp_permute(w: &[f32], rows: usize, cols: usize, n: usize) -> Vec<f32> {
    let half = rows / n / 2;
    let mut out = vec![0.0; w.len()];
    for h in 0..n {
        for two in 0..2 {
            for i in 0..half {
                // source index [h, two, i, :] lands at [h, i, two, :]
                let src = ((h * 2 + two) * half + i) * cols;
                let dst = ((h * half + i) * 2 + two) * cols;
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    out
}

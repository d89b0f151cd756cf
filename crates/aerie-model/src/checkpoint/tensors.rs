//! Host-side tensors: raw little-endian bytes plus dtype and shape, exactly as safetensors stores
//! them. Checkpoint I/O works on these so that loading then saving at the same dtype is
//! bit-identical, independent of any burn backend.

use std::collections::BTreeMap;

use half::{bf16, f16};

use crate::{Error, Result};

/// Element types aerie reads and writes in checkpoints and shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE float32.
    F32,
    /// IEEE float16.
    F16,
    /// bfloat16.
    BF16,
    /// int64 (d2t).
    I64,
    /// int32 (token ids in shards).
    I32,
    /// uint8 (loss masks in shards).
    U8,
    /// bool, one byte per element (t2d).
    Bool,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I64 => 8,
            Dtype::U8 | Dtype::Bool => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F16 | Dtype::BF16)
    }

    /// The safetensors spelling (`F32`, `BF16`, `BOOL`, ...).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I64 => "I64",
            Dtype::I32 => "I32",
            Dtype::U8 => "U8",
            Dtype::Bool => "BOOL",
        }
    }

    /// The HF `torch_dtype` spelling for float types (`float32`, `bfloat16`, `float16`).
    pub fn torch_name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F16 => "float16",
            Dtype::BF16 => "bfloat16",
            Dtype::I64 => "int64",
            Dtype::I32 => "int32",
            Dtype::U8 => "uint8",
            Dtype::Bool => "bool",
        }
    }

    /// Parse a user-facing name (`f32`, `bf16`, `float16`, ...).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => Dtype::F32,
            "f16" | "float16" | "half" => Dtype::F16,
            "bf16" | "bfloat16" => Dtype::BF16,
            "i64" | "int64" => Dtype::I64,
            "i32" | "int32" => Dtype::I32,
            "u8" | "uint8" => Dtype::U8,
            "bool" => Dtype::Bool,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

/// A tensor held on the host as safetensors bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Element type of `data`.
    pub dtype: Dtype,
    /// Shape, row-major.
    pub shape: Vec<usize>,
    /// Little-endian element bytes, `shape.iter().product() * dtype.size()` long.
    pub data: Vec<u8>,
}

impl HostTensor {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Float tensor from f32 values, stored as `dtype` (rounded to nearest even for bf16/f16).
    pub fn from_f32(shape: Vec<usize>, values: &[f32], dtype: Dtype) -> Self {
        assert_eq!(shape.iter().product::<usize>(), values.len(), "shape/value count mismatch");
        let data = match dtype {
            Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Dtype::F16 => values.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect(),
            Dtype::BF16 => values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect(),
            other => panic!("from_f32 into non-float dtype {other}"),
        };
        Self { dtype, shape, data }
    }

    /// int64 tensor.
    pub fn from_i64(shape: Vec<usize>, values: &[i64]) -> Self {
        Self { dtype: Dtype::I64, shape, data: values.iter().flat_map(|v| v.to_le_bytes()).collect() }
    }

    /// bool tensor (one byte per element, 0 or 1).
    pub fn from_bool(shape: Vec<usize>, values: &[bool]) -> Self {
        Self { dtype: Dtype::Bool, shape, data: values.iter().map(|&b| b as u8).collect() }
    }

    /// Values widened to f32; `name` is used in the error for non-float tensors.
    pub fn to_f32(&self, name: &str) -> Result<Vec<f32>> {
        let d = &self.data;
        Ok(match self.dtype {
            Dtype::F32 => d.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::F16 => d.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            Dtype::BF16 => d.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            other => return Err(Error::Dtype { name: name.into(), dtype: other.to_string() }),
        })
    }

    /// Integer values widened to i64 (I64, I32, U8, Bool).
    pub fn to_i64(&self, name: &str) -> Result<Vec<i64>> {
        let d = &self.data;
        Ok(match self.dtype {
            Dtype::I64 => d.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
            Dtype::I32 => d.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect(),
            Dtype::U8 | Dtype::Bool => d.iter().map(|&b| b as i64).collect(),
            other => return Err(Error::Dtype { name: name.into(), dtype: other.to_string() }),
        })
    }

    /// Convert a float tensor to another float dtype (identity when equal: no rounding).
    pub fn cast_float(&self, name: &str, dtype: Dtype) -> Result<Self> {
        if self.dtype == dtype {
            return Ok(self.clone());
        }
        Ok(Self::from_f32(self.shape.clone(), &self.to_f32(name)?, dtype))
    }
}

/// Named tensors. In a [`super::DrafterCheckpoint`] the names are canonical (SGLang naming with
/// no `model.` prefix: `fc.weight`, `midlayer.self_attn.q_proj.weight`, `d2t`, ...).
pub type TensorMap = BTreeMap<String, HostTensor>;

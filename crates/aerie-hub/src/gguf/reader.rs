//! The GGUF v2/v3 container, memory-mapped: header, metadata key/values, tensor infos and
//! bounds-checked views of the tensor data.
//!
//! Layout (little-endian, ggml's `docs/gguf.md`): magic `GGUF`, `u32` version, `u64` tensor
//! count, `u64` key/value count; each key/value is a string key, a `u32` value type and the value
//! (arrays: `u32` element type, `u64` count, elements); each tensor info is a string name,
//! `u32` n_dims, n_dims × `u64` dims (fastest-varying first, the reverse of HF/PyTorch shapes),
//! `u32` ggml type and a `u64` offset relative to the data section, which starts at the next
//! multiple of `general.alignment` (default 32). Strings are a `u64` length and UTF-8 bytes.
//!
//! Every read is bounds-checked: a malformed or truncated file gives
//! [`Error::GgufFormat`] naming the file, the byte offset and what was being read.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::ggml_type::GgmlType;
use crate::error::{Error, Result};

/// Alignment of the data section and of each tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Nesting limit for arrays of arrays (a corrupt file must not recurse without end).
const MAX_ARRAY_DEPTH: usize = 4;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `UINT8` (type 0).
    U8(u8),
    /// `INT8` (type 1).
    I8(i8),
    /// `UINT16` (type 2).
    U16(u16),
    /// `INT16` (type 3).
    I16(i16),
    /// `UINT32` (type 4).
    U32(u32),
    /// `INT32` (type 5).
    I32(i32),
    /// `FLOAT32` (type 6).
    F32(f32),
    /// `BOOL` (type 7).
    Bool(bool),
    /// `STRING` (type 8).
    String(String),
    /// `ARRAY` (type 9), possibly nested.
    Array(Vec<Value>),
    /// `UINT64` (type 10).
    U64(u64),
    /// `INT64` (type 11).
    I64(i64),
    /// `FLOAT64` (type 12).
    F64(f64),
}

impl Value {
    /// The GGUF name of the value type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }

    /// Any integer value, widened to `i128` so that every GGUF integer fits.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A non-negative integer value.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_int().and_then(|v| u64::try_from(v).ok())
    }

    /// A float value, or an integer read as a float. An `f32` becomes the `f64` of its shortest
    /// decimal form (`1e-5f32` gives `1e-5`, not `9.999999747378752e-6`): GGUF hyperparameters
    /// were decimals in the original config.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => v.to_string().parse().ok(),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(v) => Some(v),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// llama.cpp tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions as stored: fastest-varying first (`[cols, rows]` for a matrix).
    pub dims: Vec<u64>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements (checked against overflow when the file was opened).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape in HF/PyTorch order (slowest-varying first): the reverse of [`Self::dims`].
    pub fn hf_shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Size of the stored data in bytes, for types with a known block layout.
    pub fn n_bytes(&self) -> Option<u64> {
        let (block, bytes) = self.ggml_type.block_layout()?;
        Some(self.n_elements() / block as u64 * bytes as u64)
    }
}

/// An open, validated, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Map and parse `path`; every tensor whose type has a known block layout is checked to lie
    /// inside the file.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::ImportIo { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this struct; as with every mmap-based
        // reader (safetensors, candle), a concurrent truncation of the file by another process
        // is outside what this program can guard against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path.to_path_buf(), mmap)
    }

    fn parse(path: PathBuf, mmap: Mmap) -> Result<Self> {
        let mut r = Cursor { buf: &mmap, pos: 0, path: &path };
        let magic = r.bytes(4, "the magic")?;
        if magic != b"GGUF" {
            return Err(r.error(format!("bad magic {magic:02x?} (expected \"GGUF\")")));
        }
        let version = r.u32("the version")?;
        match version {
            2 | 3 => {}
            1 => return Err(r.error("GGUF v1 is not supported (v2 and v3 are)".into())),
            v if v.swap_bytes() <= 3 => {
                return Err(r.error("big-endian GGUF files are not supported".into()));
            }
            v => return Err(r.error(format!("unknown GGUF version {v} (v2 and v3 are supported)"))),
        }
        let n_tensors = r.u64("the tensor count")?;
        let n_kv = r.u64("the metadata count")?;

        let mut metadata = Vec::new();
        let mut index = HashMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("the key of metadata entry {i}"))?;
            let ty = r.u32(&format!("the type of `{key}`"))?;
            let value = r.value(ty, &key, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(r.error(format!("metadata key `{key}` appears twice")));
            }
            metadata.push((key, value));
        }

        let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => return Err(r.error(format!("general.alignment {v:?} is not a power of two"))),
            },
        };

        let mut tensors: Vec<TensorInfo> = Vec::new();
        let mut names = HashMap::new();
        for i in 0..n_tensors {
            let name = r.string(&format!("the name of tensor {i}"))?;
            let n_dims = r.u32(&format!("the rank of tensor `{name}`"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(r.error(format!("tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&format!("the dimensions of tensor `{name}`"))?);
            }
            if dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).is_none_or(|n| n > i64::MAX as u64) {
                return Err(r.error(format!("tensor `{name}` has an impossible shape {dims:?}")));
            }
            let ggml_type = GgmlType(r.u32(&format!("the type of tensor `{name}`"))?);
            let offset = r.u64(&format!("the offset of tensor `{name}`"))?;
            if names.insert(name.clone(), tensors.len()).is_some() {
                return Err(r.error(format!("tensor `{name}` appears twice")));
            }
            tensors.push(TensorInfo { name, dims, ggml_type, offset });
        }
        let data_start = (r.pos as u64).next_multiple_of(alignment);

        let file_len = mmap.len() as u64;
        // Data ranges [offset, offset + bytes) of the tensors with a known layout, to refuse
        // overlaps below, as llama.cpp does: two tensors sharing bytes is a corrupt file.
        let mut ranges: Vec<(u64, u64, &str)> = Vec::with_capacity(tensors.len());
        for t in &tensors {
            let fail = |problem: String| Error::GgufFormat { path: path.clone(), problem };
            if t.offset % alignment != 0 {
                return Err(fail(format!(
                    "tensor `{}`: offset {} is not a multiple of the alignment {alignment}",
                    t.name, t.offset
                )));
            }
            let Some((block, _)) = t.ggml_type.block_layout() else { continue };
            if t.dims[0] % block as u64 != 0 {
                return Err(fail(format!(
                    "tensor `{}`: {} rows of {} values do not split into {} blocks of {block}",
                    t.name, t.ggml_type, t.dims[0], t.ggml_type
                )));
            }
            let n_bytes = t.n_bytes().unwrap_or(0);
            let end = data_start.checked_add(t.offset).and_then(|s| s.checked_add(n_bytes));
            if end.is_none_or(|end| end > file_len) {
                return Err(fail(format!(
                    "tensor `{}` ({} bytes at data offset {}) runs past the end of the file \
                     ({file_len} bytes, data section at {data_start}): the file is truncated",
                    t.name, n_bytes, t.offset
                )));
            }
            ranges.push((t.offset, t.offset + n_bytes, &t.name));
        }
        ranges.sort_unstable();
        if let Some(w) = ranges.windows(2).find(|w| w[1].0 < w[0].1) {
            let ((a0, a1, a), (b0, b1, b)) = (w[0], w[1]);
            return Err(Error::GgufFormat {
                path: path.clone(),
                problem: format!(
                    "tensors `{a}` (data bytes {a0}..{a1}) and `{b}` (data bytes {b0}..{b1}) overlap: the file is corrupt"
                ),
            });
        }

        Ok(Self { path, mmap, version, alignment, data_start, metadata, index, tensors, tensor_index: names })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// One tensor info by its GGUF name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The stored bytes of a tensor (bounds checked at open); errors for a type without a known
    /// block layout.
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8]> {
        let n_bytes = info.n_bytes().ok_or_else(|| Error::GgufTensorType {
            path: self.path.clone(),
            tensor: info.name.clone(),
            ggml_type: info.ggml_type.to_string(),
            supported: super::dequant::SUPPORTED.join(", "),
        })?;
        // Checked at open for the tensors of this file; checked again for a `TensorInfo` built
        // by hand.
        let range = self.data_start.checked_add(info.offset).and_then(|s| Some(s..s.checked_add(n_bytes)?));
        range
            .and_then(|r| self.mmap.get(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?))
            .ok_or_else(|| self.format_error(format!("tensor `{}` lies outside the file", info.name)))
    }

    /// An [`Error::GgufFormat`] for this file.
    pub(crate) fn format_error(&self, problem: String) -> Error {
        Error::GgufFormat { path: self.path.clone(), problem }
    }

    fn typed<'a, T>(&'a self, key: &str, want: &str, f: impl FnOnce(&'a Value) -> Option<T>) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v)
                .map(Some)
                .ok_or_else(|| self.format_error(format!("metadata `{key}` is a {}, expected {want}", v.type_name()))),
        }
    }

    /// A non-negative integer metadata value; errors if present with another type.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    /// A numeric metadata value as `f64`; errors if present with another type.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a number", Value::as_f64)
    }

    /// A boolean metadata value; errors if present with another type.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", Value::as_bool)
    }

    /// A string metadata value; errors if present with another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "a string", Value::as_str)
    }

    /// An array of strings; errors if present with another type.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        self.typed(key, "an array of strings", |v| v.as_array()?.iter().map(Value::as_str).collect())
    }

    /// An array of integers; errors if present with another type.
    pub fn get_int_array(&self, key: &str) -> Result<Option<Vec<i128>>> {
        self.typed(key, "an array of integers", |v| v.as_array()?.iter().map(Value::as_int).collect())
    }
}

/// Bounds-checked little-endian reads over the mapped file.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn error(&self, problem: String) -> Error {
        Error::GgufFormat { path: self.path.to_path_buf(), problem }
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let end = usize::try_from(n).ok().and_then(|n| self.pos.checked_add(n));
        match end.and_then(|end| self.buf.get(self.pos..end)) {
            Some(b) => {
                self.pos += b.len();
                Ok(b)
            }
            None => Err(self.error(format!(
                "truncated at byte {} while reading {what} ({n} bytes needed, file is {} bytes)",
                self.pos,
                self.buf.len()
            ))),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let b = self.bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let start = self.pos;
        let len = self.u64(what)?;
        let bytes = self.bytes(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.error(format!("{what} (string at byte {start}) is not valid UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value> {
        let what = || format!("the value of `{key}`");
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array(&what())?)),
            1 => Value::I8(i8::from_le_bytes(self.array(&what())?)),
            2 => Value::U16(u16::from_le_bytes(self.array(&what())?)),
            3 => Value::I16(i16::from_le_bytes(self.array(&what())?)),
            4 => Value::U32(u32::from_le_bytes(self.array(&what())?)),
            5 => Value::I32(i32::from_le_bytes(self.array(&what())?)),
            6 => Value::F32(f32::from_le_bytes(self.array(&what())?)),
            7 => match self.array::<1>(&what())?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.error(format!("`{key}`: bool byte {b} is neither 0 nor 1"))),
            },
            8 => Value::String(self.string(&what())?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.error(format!("`{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let elem = self.u32(&format!("the element type of `{key}`"))?;
                let n = self.u64(&format!("the length of `{key}`"))?;
                // Every element takes at least one byte: a count beyond the bytes left is a
                // corrupt file, and must not drive a huge allocation.
                if n > (self.buf.len() - self.pos) as u64 {
                    return Err(self.error(format!(
                        "`{key}`: array of {n} elements is longer than the {} bytes left (truncated?)",
                        self.buf.len() - self.pos
                    )));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(&what())?)),
            11 => Value::I64(i64::from_le_bytes(self.array(&what())?)),
            12 => Value::F64(f64::from_le_bytes(self.array(&what())?)),
            t => return Err(self.error(format!("`{key}` has unknown value type {t}"))),
        })
    }
}

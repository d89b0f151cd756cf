//! ggml's tensor type ids (`enum ggml_type`) with their names and block layouts, shared by the
//! GGUF container ([`super::reader`]), which sizes each tensor by them, and by dequantisation
//! ([`super::dequant`]), which decodes the types it supports.

use std::fmt;

/// A ggml tensor type id (`enum ggml_type`), with the names and block layouts of the known ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// `(id, name, elements per block, bytes per block)`, from ggml's `type_traits` table.
const GGML_TYPES: &[(u32, &str, usize, usize)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

#[allow(missing_docs)]
impl GgmlType {
    pub const F32: Self = Self(0);
    pub const F16: Self = Self(1);
    pub const Q4_0: Self = Self(2);
    pub const Q4_1: Self = Self(3);
    pub const Q5_0: Self = Self(6);
    pub const Q5_1: Self = Self(7);
    pub const Q8_0: Self = Self(8);
    pub const Q4_K: Self = Self(12);
    pub const Q6_K: Self = Self(14);
    pub const BF16: Self = Self(30);
}

impl GgmlType {
    fn entry(self) -> Option<&'static (u32, &'static str, usize, usize)> {
        GGML_TYPES.iter().find(|e| e.0 == self.0)
    }

    /// ggml's name of the type (`Q4_1`), if the id is known.
    pub fn name(self) -> Option<&'static str> {
        self.entry().map(|e| e.1)
    }

    /// `(elements per block, bytes per block)`, if the id is known.
    pub fn block_layout(self) -> Option<(usize, usize)> {
        self.entry().map(|e| (e.2, e.3))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "type#{}", self.0),
        }
    }
}

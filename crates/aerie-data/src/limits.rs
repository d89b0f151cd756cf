//! The one place for each limit on a size or count that aerie reads from a flag or a file before
//! it allocates or loops by it. A config or flag past these is a typo or a corrupt file, never
//! a model: checked before use, it is an error naming the value, the limit and why, where
//! unchecked it was an abort on an 80 GB allocation, a loop that never ends, or a process
//! growing until the machine kills it. Each limit is far above every model in use (the numbers
//! in each doc comment) and far below what would exhaust a machine.

use crate::{Error, Result};

/// Token ids in a vocabulary (target or draft) at most: 2^24. The largest vocabularies in use
/// hold about 262 144 ids (Gemma); a count, a mapping and a logit row per id of a larger one is
/// gigabytes for nothing.
pub const MAX_VOCAB: u64 = 1 << 24;
/// Transformer layers at most: 1024 (the deepest open models have about 126).
pub const MAX_LAYERS: u64 = 1024;
/// A width (hidden or intermediate size, attention heads, head dimension) at most: 2^18 =
/// 262 144 (the widest open models have hidden 16 384 and intermediate 53 248).
pub const MAX_WIDTH: u64 = 1 << 18;
/// Positions of a context at most: 2^24 (the longest contexts in use are about 10^7 tokens).
pub const MAX_POSITIONS: u64 = 1 << 24;

/// `value` of `what` (a flag, or a file and its key) when it is at most `limit`, else an error
/// naming all three and why the limit is what it is.
pub fn check(what: impl Into<String>, value: impl TryInto<u128> + Copy, limit: u64, why: &'static str) -> Result<()> {
    let v: u128 = value.try_into().unwrap_or(u128::MAX);
    if v <= u128::from(limit) {
        return Ok(());
    }
    Err(Error::Limit { what: what.into(), value: v, limit, why })
}

/// Why [`MAX_VOCAB`] is what it is.
pub const WHY_VOCAB: &str = "the largest vocabularies in use hold about 262 144 tokens";
/// Why [`MAX_LAYERS`] is what it is.
pub const WHY_LAYERS: &str = "the deepest models in use have about 126 layers";
/// Why [`MAX_WIDTH`] is what it is.
pub const WHY_WIDTH: &str = "the widest models in use have hidden sizes of 16 384 and intermediate sizes of 53 248";
/// Why [`MAX_POSITIONS`] is what it is.
pub const WHY_POSITIONS: &str = "the longest contexts in use are about 10 million tokens";

/// Bytes of one record of an input file (a JSONL line, a JSON array element, a prompt line) at
/// most: 256 MiB. The longest conversations in use are a few MB; a line without end (`/dev/zero`
/// or a FIFO given as input, a binary file) would otherwise grow until the machine kills aerie.
pub const MAX_RECORD_BYTES: u64 = 256 << 20;
/// Why [`MAX_RECORD_BYTES`] is what it is.
pub const WHY_RECORD: &str = "the longest conversations in use are a few MB; is this a JSON Lines file?";
/// Devices of one run at most (`train --devices`): 1024, far above the 8 or 16 accelerators of
/// a machine; a range is checked against it before it is expanded.
pub const MAX_DEVICES: u64 = 1024;
/// Why [`MAX_DEVICES`] is what it is.
pub const WHY_DEVICES: &str = "a machine has at most a few dozen accelerators";

/// A vocabulary size (target or draft) of `what`.
pub fn vocab(what: impl Into<String>, value: impl TryInto<u128> + Copy) -> Result<()> {
    check(what, value, MAX_VOCAB, WHY_VOCAB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_past_its_limit_names_value_limit_and_why() {
        vocab("--vocab-size", 262_144usize).unwrap();
        let err = vocab("--vocab-size", u64::MAX).unwrap_err().to_string();
        assert!(err.contains("--vocab-size = 18446744073709551615") && err.contains("limit of 16777216"), "{err}");
        let err = check("config.json: num_hidden_layers", 1_000_000_000usize, MAX_LAYERS, WHY_LAYERS).unwrap_err();
        assert!(err.to_string().contains("126 layers"), "{err}");
    }
}

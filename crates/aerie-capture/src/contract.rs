//! The capture contract, written once for every engine: from the target's files, the prepared
//! dataset and the capture's options, aerie computes the shard metadata a capture writes and
//! makes every check that needs no engine (the aux layers and their range, the vocabulary, the
//! tokenizer digest). The native capture writes that metadata itself; the Python worker
//! (`python/aerie_capture`) receives it whole (`--metadata`, the shard header's own map) and
//! asserts only what its engine reports: the layer count, hidden size and vocabulary it loaded
//! equal the metadata's. So a rule lives in one language: the Python copies of the aux default,
//! the aux range and the tokenizer-digest fallback had drifted from these (the last layer's
//! output accepted here and refused there; a target without `tokenizer.json` accepted unchecked
//! there and refused here).

use std::path::Path;

use aerie_data::prepare::PreparedDataset;
use aerie_data::shard::{AuxConvention, ShardMetadata};
use aerie_data::tokenizer::TokenizerFiles;

use crate::{CaptureOptions, Error, Result};

/// What the shard metadata says about the target's shape (read by `aerie_data`, where the
/// shards' other readers find it too).
pub use aerie_data::hf_config::TargetShape;

/// The aux layers of a capture, output-of-layer: `ids` as given, or EAGLE-3's default
/// `[1, N/2 - 1, N - 4]`. They must be strictly increasing and at most `N - 2`: the output of the
/// last layer is seen only after the final norm by transformers (its last `hidden_states`) and
/// never by SGLang (which captures at the input of the next layer), so a dataset of it could be
/// neither captured by every engine nor served by SGLang.
pub fn aux_layers(ids: Option<&[usize]>, num_layers: usize) -> Result<Vec<usize>> {
    let ids = match ids {
        Some(ids) => ids.to_vec(),
        None => aerie_model::AuxLayers::default_for_target(num_layers).ids,
    };
    if ids.is_empty() {
        return Err(Error::Invalid("--aux-layers is empty".into()));
    }
    if ids.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Error::Invalid(format!("aux layers {ids:?} must be strictly increasing (low → high)")));
    }
    let last = num_layers.saturating_sub(2);
    if let Some(&bad) = ids.iter().find(|&&i| num_layers < 2 || i > last) {
        return Err(Error::Invalid(format!(
            "aux layer {bad} (output-of-layer) cannot be captured from a target with {num_layers} layers (valid: 0..={last}; \
             the last layer's output is only seen after the final norm)"
        )));
    }
    Ok(ids)
}

/// The metadata of a capture of `data` through the target in `target_dir` of shape `shape`,
/// after checking that the prepared data was tokenised for this target (same vocabulary size,
/// same tokenizer digest, by the rule of docs/shard-format.md: `tokenizer.json`'s sha256, or
/// Kimi's tiktoken rule).
pub fn metadata(
    target_dir: &Path,
    shape: TargetShape,
    data: &PreparedDataset,
    opts: &CaptureOptions,
) -> Result<ShardMetadata> {
    let aux = aux_layers(opts.aux_layers.as_deref(), shape.num_layers)?;
    if data.vocab_size() != shape.vocab_size {
        return Err(Error::Invalid(format!(
            "{}: prepared with a tokenizer of {} tokens, the target has a vocabulary of {}",
            data.dir().display(),
            data.vocab_size(),
            shape.vocab_size
        )));
    }
    let tokenizer = TokenizerFiles::load(target_dir)?;
    if tokenizer.digest != data.report().tokenizer_digest {
        return Err(Error::Invalid(format!(
            "{} was prepared with a different tokenizer than {} (digest {} vs {})",
            data.dir().display(),
            tokenizer.file().display(),
            data.report().tokenizer_digest,
            tokenizer.digest
        )));
    }
    let metadata = ShardMetadata {
        target: opts.target_name.clone(),
        target_num_layers: shape.num_layers,
        target_vocab_size: shape.vocab_size,
        aux_layer_ids: aux,
        aux_convention: AuxConvention::OutputOfLayer,
        hidden_size: shape.hidden_size,
        dtype: opts.dtype,
        tokenizer_digest: tokenizer.digest,
        chat_template: data.report().template.clone(),
        teacher: opts.teacher,
        created_by: format!("aerie-capture {}", env!("CARGO_PKG_VERSION")),
        extra: Default::default(),
    };
    metadata.validate().map_err(|e| Error::Invalid(format!("capture metadata: {e}")))?;
    Ok(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aux_default_and_range_are_one_rule() {
        assert_eq!(aux_layers(None, 30).unwrap(), [1, 14, 26]);
        assert_eq!(aux_layers(None, 61).unwrap(), [1, 29, 57]);
        assert_eq!(aux_layers(Some(&[0, 4]), 6).unwrap(), [0, 4]);
        // The last layer's output: refused for every engine (the Python worker refused it, the
        // native capture took it).
        let e = aux_layers(Some(&[1, 5]), 6).unwrap_err().to_string();
        assert!(e.contains("aux layer 5") && e.contains("0..=4"), "{e}");
        assert!(aux_layers(Some(&[3, 1]), 30).unwrap_err().to_string().contains("strictly increasing"));
        assert!(aux_layers(Some(&[]), 30).is_err());
        assert!(aux_layers(Some(&[0]), 1).is_err());
    }
}

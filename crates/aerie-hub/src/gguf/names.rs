//! The one home of llama.cpp ↔ HF tensor names for the llama architecture, and of llama.cpp's
//! Q/K row permutation.
//!
//! llama.cpp's `convert_hf_to_gguf.py` (`LlamaModel.modify_tensors`) renames HF tensors (table
//! below) and reorders the rows of `q_proj` and `k_proj` (weights and biases) with
//! `permute(w, n_head, n_head_kv)`:
//!
//! ```text
//! w.reshape(n, 2, rows / n / 2, cols).swapaxes(1, 2).reshape(rows, cols)
//! ```
//!
//! with `n = n_head` for Q and `n = n_head_kv` for K. It turns each head's rotate-half layout
//! (first half of the rotary dims, then the second) into llama.cpp's interleaved pairs. Loading
//! into HF's `rotate_half` layout needs the inverse, [`unpermute_rows`]; forgetting it gives a
//! model that loads without error and produces garbage.

/// What a tensor needs beyond its rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// Stored in HF order.
    Keep,
    /// Permuted with `n_head` (`q_proj`).
    PermutedQ,
    /// Permuted with `n_head_kv` (`k_proj`).
    PermutedK,
}

/// Per-layer tensors: `blk.N.<gguf>` ↔ `model.layers.N.<hf>`.
const LAYER_TENSORS: &[(&str, &str, RowOrder)] = &[
    ("attn_norm.weight", "input_layernorm.weight", RowOrder::Keep),
    ("attn_q.weight", "self_attn.q_proj.weight", RowOrder::PermutedQ),
    ("attn_k.weight", "self_attn.k_proj.weight", RowOrder::PermutedK),
    ("attn_v.weight", "self_attn.v_proj.weight", RowOrder::Keep),
    ("attn_output.weight", "self_attn.o_proj.weight", RowOrder::Keep),
    // Biases exist only for `attention_bias: true` checkpoints; Q/K biases are permuted too.
    ("attn_q.bias", "self_attn.q_proj.bias", RowOrder::PermutedQ),
    ("attn_k.bias", "self_attn.k_proj.bias", RowOrder::PermutedK),
    ("attn_v.bias", "self_attn.v_proj.bias", RowOrder::Keep),
    ("attn_output.bias", "self_attn.o_proj.bias", RowOrder::Keep),
    ("ffn_norm.weight", "post_attention_layernorm.weight", RowOrder::Keep),
    ("ffn_gate.weight", "mlp.gate_proj.weight", RowOrder::Keep),
    ("ffn_up.weight", "mlp.up_proj.weight", RowOrder::Keep),
    ("ffn_down.weight", "mlp.down_proj.weight", RowOrder::Keep),
];

/// Whole-model tensors. `output.weight` is absent when the embeddings are tied.
const MODEL_TENSORS: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// The HF name of a llama.cpp tensor and the row order it is stored in; `None` for a name this
/// table does not know.
pub fn hf_name(gguf: &str) -> Option<(String, RowOrder)> {
    if let Some(&(_, hf)) = MODEL_TENSORS.iter().find(|(g, _)| *g == gguf) {
        return Some((hf.to_string(), RowOrder::Keep));
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok().filter(|_| !layer.starts_with('+'))?;
    let &(_, hf, order) = LAYER_TENSORS.iter().find(|(g, _, _)| *g == suffix)?;
    Some((format!("model.layers.{layer}.{hf}"), order))
}

/// The llama.cpp name of an HF tensor (the inverse of [`hf_name`]).
pub fn gguf_name(hf: &str) -> Option<String> {
    if let Some(&(gguf, _)) = MODEL_TENSORS.iter().find(|(_, h)| *h == hf) {
        return Some(gguf.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok().filter(|_| !layer.starts_with('+'))?;
    let &(gguf, _, _) = LAYER_TENSORS.iter().find(|(_, h, _)| *h == suffix)?;
    Some(format!("blk.{layer}.{gguf}"))
}

/// Why rows cannot be (un)permuted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermuteError {
    /// Rows of the tensor.
    pub rows: usize,
    /// Heads it was meant to split into.
    pub n_head: usize,
}

/// Validate that `data` is `rows × cols` with `rows` a multiple of `2·n_head`; returns the
/// rows per half head.
fn half_rows(data_len: usize, rows: usize, cols: usize, n_head: usize) -> Result<usize, PermuteError> {
    let err = PermuteError { rows, n_head };
    if n_head == 0 || !rows.is_multiple_of(2 * n_head) || rows.checked_mul(cols) != Some(data_len) {
        return Err(err);
    }
    Ok(rows / n_head / 2)
}

/// Row `r` of the permuted matrix comes from row `source(r)` of the HF matrix: within a head,
/// the permuted row `2·i + j` is the HF row `j·half + i` (the swap of axes 1 and 2).
fn hf_row_of_permuted(r: usize, half: usize) -> usize {
    let (head, within) = (r / (2 * half), r % (2 * half));
    let (i, j) = (within / 2, within % 2);
    head * 2 * half + j * half + i
}

/// llama.cpp's `permute(w, n_head)` on a row-major `rows × cols` matrix (`cols = 1` for a bias):
/// HF layout in, llama.cpp layout out. Used by tests and as the reference for the inverse.
pub fn permute_rows<T: Copy>(data: &[T], rows: usize, cols: usize, n_head: usize) -> Result<Vec<T>, PermuteError> {
    let half = half_rows(data.len(), rows, cols, n_head)?;
    let mut out = Vec::with_capacity(data.len());
    for r in 0..rows {
        let src = hf_row_of_permuted(r, half);
        out.extend_from_slice(&data[src * cols..(src + 1) * cols]);
    }
    Ok(out)
}

/// The inverse of [`permute_rows`]: llama.cpp layout in, HF layout out.
pub fn unpermute_rows<T: Copy>(data: &[T], rows: usize, cols: usize, n_head: usize) -> Result<Vec<T>, PermuteError> {
    let half = half_rows(data.len(), rows, cols, n_head)?;
    let mut out = data.to_vec();
    for r in 0..rows {
        let dst = hf_row_of_permuted(r, half);
        out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[r * cols..(r + 1) * cols]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for l in [0usize, 7, 29] {
            for (g, h, _) in LAYER_TENSORS {
                let gguf = format!("blk.{l}.{g}");
                let (hf, _) = hf_name(&gguf).unwrap();
                assert_eq!(hf, format!("model.layers.{l}.{h}"));
                assert_eq!(gguf_name(&hf).unwrap(), gguf);
            }
        }
        for (g, h) in MODEL_TENSORS {
            assert_eq!(hf_name(g).unwrap(), (h.to_string(), RowOrder::Keep));
            assert_eq!(gguf_name(h).unwrap(), *g);
        }
        assert_eq!(hf_name("blk.0.attn_q.weight").unwrap().1, RowOrder::PermutedQ);
        assert_eq!(hf_name("blk.3.attn_k.bias").unwrap().1, RowOrder::PermutedK);
        for bad in ["rope_freqs.weight", "blk.x.attn_q.weight", "blk.+1.attn_q.weight", "blk.0.ffn_gate_inp.weight"] {
            assert_eq!(hf_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn permute_matches_hand_example() {
        // One head of 4 rows (half = 2), 1 column: reshape(1, 2, 2).swapaxes(1, 2) turns rows
        // [a0 a1 | b0 b1] into [a0 b0 a1 b1].
        assert_eq!(permute_rows(&[0, 1, 2, 3], 4, 1, 1).unwrap(), vec![0, 2, 1, 3]);
        // Two heads of 6 rows (half = 3), 2 columns.
        let hf: Vec<u32> = (0..24).collect();
        let rows = |order: &[u32]| order.iter().flat_map(|&r| [2 * r, 2 * r + 1]).collect::<Vec<_>>();
        let want = rows(&[0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]);
        assert_eq!(permute_rows(&hf, 12, 2, 2).unwrap(), want);
        assert_eq!(unpermute_rows(&want, 12, 2, 2).unwrap(), hf);
    }

    #[test]
    fn unpermute_inverts_permute() {
        // SmolLM2-like proportions: 9 Q heads and 3 KV heads of 64, 8 columns.
        for (n_head, rows) in [(9usize, 576usize), (3, 192), (1, 4), (4, 32)] {
            let cols = 8;
            let w: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let p = permute_rows(&w, rows, cols, n_head).unwrap();
            assert_ne!(p, w);
            assert_eq!(unpermute_rows(&p, rows, cols, n_head).unwrap(), w);
            assert_eq!(permute_rows(&unpermute_rows(&w, rows, cols, n_head).unwrap(), rows, cols, n_head).unwrap(), w);
        }
    }

    #[test]
    fn permute_rejects_bad_shapes() {
        assert!(unpermute_rows(&[0.0f32; 12], 6, 2, 2).is_err()); // 6 rows, 2 heads: odd half
        assert!(unpermute_rows(&[0.0f32; 8], 4, 1, 1).is_err()); // length mismatch
        assert!(unpermute_rows(&[0.0f32; 4], 4, 1, 0).is_err());
    }
}

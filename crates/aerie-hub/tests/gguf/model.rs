//! A tiny llama GGUF (2 layers, hidden 32, 4 heads, 2 KV heads) whose tensors mix every
//! supported block type, with the HF-layout values the import must produce.

use std::collections::BTreeMap;

use aerie_hub::gguf::{GgmlType, Value};

use crate::writer::{GgufWriter, Lcg, byte_char, encode, grid_values, llama_cpp_permute, s, strs};

pub const HIDDEN: usize = 32;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = 8;
pub const FFN: usize = 64;
pub const LAYERS: usize = 2;

pub const SPECIALS: &[&str] = &["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
pub const USER_DEFINED: &str = "<tool>";
/// Merges in rank order; each also adds its concatenation to the vocabulary.
pub const MERGES: &[(&str, &str)] = &[
    ("h", "e"),
    ("l", "l"),
    ("he", "ll"),
    ("hell", "o"),
    ("Ġ", "w"),
    ("o", "r"),
    ("Ġw", "or"),
    ("Ġwor", "l"),
    ("Ġworl", "d"),
    ("2", "0"),
];

pub struct TinyModel {
    pub writer: GgufWriter,
    /// HF name → (HF shape, values).
    pub expected: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    pub vocab: Vec<String>,
}

/// The tokens: 3 control tokens, 1 user-defined, the 256 byte characters, then the merges.
pub fn vocab() -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|t| t.to_string()).collect();
    let mut types = vec![3; SPECIALS.len()];
    tokens.push(USER_DEFINED.into());
    types.push(4);
    for b in 0..=255u8 {
        tokens.push(byte_char(b).to_string());
        types.push(1);
    }
    for (a, b) in MERGES {
        tokens.push(format!("{a}{b}"));
        types.push(1);
    }
    (tokens, types)
}

pub fn id_of(vocab: &[String], token: &str) -> u32 {
    vocab.iter().position(|t| t == token).unwrap() as u32
}

/// Metadata of the tiny model (no tensors).
pub fn metadata(w: &mut GgufWriter, pre: &str) -> Vec<String> {
    let (tokens, types) = vocab();
    w.kv("general.architecture", s("llama"))
        .kv("general.name", s("tiny"))
        .kv("llama.block_count", Value::U32(LAYERS as u32))
        .kv("llama.context_length", Value::U32(256))
        .kv("llama.embedding_length", Value::U32(HIDDEN as u32))
        .kv("llama.feed_forward_length", Value::U32(FFN as u32))
        .kv("llama.attention.head_count", Value::U32(HEADS as u32))
        .kv("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv("llama.rope.dimension_count", Value::U32(HEAD_DIM as u32))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("llama.vocab_size", Value::U32(tokens.len() as u32))
        .kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.pre", s(pre))
        .kv("tokenizer.ggml.tokens", strs(&tokens))
        .kv("tokenizer.ggml.token_type", Value::Array(types.iter().map(|&t| Value::I32(t)).collect()))
        .kv("tokenizer.ggml.merges", strs(&MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
        .kv("tokenizer.ggml.unknown_token_id", Value::U32(0))
        .kv("tokenizer.ggml.padding_token_id", Value::U32(2))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .kv("tokenizer.chat_template", s("{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"));
    tokens
}

/// Build the tiny model; `tied` leaves out `output.weight`.
pub fn tiny_llama(tied: bool, pre: &str) -> TinyModel {
    let mut w = GgufWriter::new();
    let vocab = metadata(&mut w, pre);
    let mut rng = Lcg(7);
    let mut expected = BTreeMap::new();
    let mut add =
        |w: &mut GgufWriter, gguf: &str, hf: &str, ty: GgmlType, shape: Vec<usize>, permute_heads: Option<usize>| {
            let n: usize = shape.iter().product();
            let values = grid_values(ty, n, &mut rng);
            let stored = match permute_heads {
                Some(h) => llama_cpp_permute(&values, shape[0], shape.get(1).copied().unwrap_or(1), h),
                None => values.clone(),
            };
            let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
            w.tensor(gguf, &dims, ty, encode(ty, &stored));
            expected.insert(hf.to_string(), (shape, values));
        };
    let v = vocab.len();
    add(&mut w, "token_embd.weight", "model.embed_tokens.weight", GgmlType::Q8_0, vec![v, HIDDEN], None);
    for l in 0..LAYERS {
        use GgmlType as T;
        // Layer 0 and layer 1 store the same roles in different types.
        let [q, k, vv, o, gate, up, down] = if l == 0 {
            [T::F16, T::Q4_0, T::Q4_1, T::BF16, T::Q4_1, T::Q8_0, T::F16]
        } else {
            [T::Q4_1, T::Q8_0, T::Q4_0, T::F32, T::Q8_0, T::Q4_1, T::BF16]
        };
        let (qd, kd) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
        let p = |g: &str| format!("blk.{l}.{g}");
        let h = |n: &str| format!("model.layers.{l}.{n}");
        add(&mut w, &p("attn_norm.weight"), &h("input_layernorm.weight"), T::F32, vec![HIDDEN], None);
        add(&mut w, &p("attn_q.weight"), &h("self_attn.q_proj.weight"), q, vec![qd, HIDDEN], Some(HEADS));
        add(&mut w, &p("attn_k.weight"), &h("self_attn.k_proj.weight"), k, vec![kd, HIDDEN], Some(KV_HEADS));
        add(&mut w, &p("attn_v.weight"), &h("self_attn.v_proj.weight"), vv, vec![kd, HIDDEN], None);
        add(&mut w, &p("attn_output.weight"), &h("self_attn.o_proj.weight"), o, vec![HIDDEN, qd], None);
        add(&mut w, &p("ffn_norm.weight"), &h("post_attention_layernorm.weight"), T::F32, vec![HIDDEN], None);
        add(&mut w, &p("ffn_gate.weight"), &h("mlp.gate_proj.weight"), gate, vec![FFN, HIDDEN], None);
        add(&mut w, &p("ffn_up.weight"), &h("mlp.up_proj.weight"), up, vec![FFN, HIDDEN], None);
        add(&mut w, &p("ffn_down.weight"), &h("mlp.down_proj.weight"), down, vec![HIDDEN, FFN], None);
    }
    add(&mut w, "output_norm.weight", "model.norm.weight", GgmlType::F32, vec![HIDDEN], None);
    if !tied {
        add(&mut w, "output.weight", "lm_head.weight", GgmlType::Q4_0, vec![v, HIDDEN], None);
    }
    TinyModel { writer: w, expected, vocab }
}

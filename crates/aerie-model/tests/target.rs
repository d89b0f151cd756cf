//! The native target model (`aerie_model::native`) against the independent f64 reference
//! (`target_reference/`), on tiny random checkpoints written to disk as real safetensors plus an
//! HF `config.json` and loaded through the public loader: logits, aux features and final hidden
//! state; incremental decoding with the cache; rollback with `truncate`; tree verification with a
//! custom mask and `retain`; greedy generation; loader errors.
//!
//! Tolerance: 1e-4 relative to the largest reference magnitude of each tensor. f32 has 6e-8 unit
//! roundoff and the tiny models accumulate a few thousand operations per output, so agreement is
//! ~1e-6; 1e-4 leaves a wide margin while any real mistake (a wrong position, head or mask) is
//! O(1e-1).

mod target_reference;

use std::path::Path;

use aerie_model::checkpoint::io::{INDEX_FILE, SINGLE_FILE, write_safetensors};
use aerie_model::checkpoint::{Dtype, TensorMap};
use aerie_model::{
    AuxConvention, AuxLayers, CaptureRequest, Error, LogitsMode, TargetCache, TargetConfig, TargetModel,
};
use burn::backend::Flex;
use burn::tensor::{Bool, DType, Int, Tensor, TensorData};
use target_reference::{Mat, RefConfig, RefRope, Rng, below, forward as ref_forward, greedy, random_checkpoint};

type B = Flex;

const TOL: f64 = 1e-4;

fn write_checkpoint(dir: &Path, c: &RefConfig, w: &TensorMap) {
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&c.config_json()).unwrap()).unwrap();
    write_safetensors(&dir.join(SINGLE_FILE), w).unwrap();
}

/// Write `c`/`w` to a fresh directory and load it through the public loader.
fn load(c: &RefConfig, w: &TensorMap) -> (tempfile::TempDir, TargetModel<B>) {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), c, w);
    let model = TargetModel::<B>::load(dir.path(), &Default::default()).unwrap();
    (dir, model)
}

fn ids(rows: &[Vec<usize>]) -> Tensor<B, 2, Int> {
    let s = rows[0].len();
    let flat: Vec<i64> = rows.iter().flat_map(|r| r.iter().map(|&t| t as i64)).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), s]), &Default::default())
}

/// `[B, S, X]` → per row, per position, values.
fn rows(t: &Tensor<B, 3>) -> Vec<Mat> {
    let [b, s, x] = t.dims();
    let v: Vec<f64> = t.clone().into_data().iter::<f32>().map(|v| v as f64).collect();
    (0..b).map(|i| (0..s).map(|j| v[(i * s + j) * x..(i * s + j + 1) * x].to_vec()).collect()).collect()
}

/// max |got - want| / max |want| over the matrix.
fn rel_err(got: &[Vec<f64>], want: &[Vec<f64>]) -> f64 {
    assert_eq!(got.len(), want.len(), "row count");
    let mut diff: f64 = 0.0;
    let mut scale: f64 = 0.0;
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len(), "row width");
        for (a, b) in g.iter().zip(w) {
            diff = diff.max((a - b).abs());
            scale = scale.max(b.abs());
        }
    }
    diff / scale.max(1e-30)
}

fn assert_close(what: &str, got: &[Vec<f64>], want: &[Vec<f64>]) {
    let e = rel_err(got, want);
    assert!(e <= TOL, "{what}: relative error {e:.3e} > {TOL:e}");
}

fn random_ids(rng: &mut Rng, vocab: usize, n: usize) -> Vec<usize> {
    (0..n).map(|_| below(rng, vocab)).collect()
}

fn output_of(ids: &[usize]) -> AuxLayers {
    AuxLayers { ids: ids.to_vec(), convention: AuxConvention::OutputOfLayer }
}

/// Full forward of a batch of equal-length sequences against the reference: logits, aux at
/// `aux` (output-of-layer, plus the input-of-layer form of the same request), final hidden.
fn check_against_reference(c: &RefConfig, w: &TensorMap, model: &TargetModel<B>, seqs: &[Vec<usize>], aux: &[usize]) {
    let mut cache = model.new_cache();
    let want = CaptureRequest::with_aux(output_of(aux), LogitsMode::All);
    let out = model.forward(ids(seqs), &mut cache, &want).unwrap();
    assert_eq!(cache.len(), seqs[0].len());
    let logits = rows(out.logits.as_ref().unwrap());
    let fin = rows(&out.final_hidden);
    let concat = rows(&out.aux_concat().unwrap());
    for (b, seq) in seqs.iter().enumerate() {
        let pos: Vec<usize> = (0..seq.len()).collect();
        let r = ref_forward(c, w, seq, &pos);
        assert_close(&format!("logits row {b}"), &logits[b], &r.logits);
        assert_close(&format!("final hidden row {b}"), &fin[b], &r.final_hidden);
        for (k, &layer) in aux.iter().enumerate() {
            // Output of layer i = HF output_hidden_states[i + 1] (pre-norm here).
            assert_close(&format!("aux layer {layer} row {b}"), &rows(&out.aux[k])[b], &r.hidden_states[layer + 1]);
        }
        let want_concat: Mat =
            (0..seq.len()).map(|t| aux.iter().flat_map(|&l| r.hidden_states[l + 1][t].clone()).collect()).collect();
        assert_close(&format!("aux_concat row {b}"), &concat[b], &want_concat);
    }
    // The same layers in the input-of-layer convention give the same tensors.
    let input_ids: Vec<usize> = aux.iter().map(|&i| i + 1).collect();
    let req = CaptureRequest::with_aux(
        AuxLayers { ids: input_ids, convention: AuxConvention::InputOfLayer },
        LogitsMode::None,
    );
    let again = model.forward(ids(seqs), &mut model.new_cache(), &req).unwrap();
    assert!(again.logits.is_none());
    assert_eq!(rel_err(&rows(&again.aux_concat().unwrap())[0], &concat[0]), 0.0);
}

#[test]
fn llama_gqa_untied_matches_reference() {
    let c = RefConfig::llama_gqa();
    let w = random_checkpoint(&c, 1, Dtype::F32);
    let (_dir, model) = load(&c, &w);
    assert_eq!(model.num_layers(), 4);
    let mut rng = Rng(7);
    let seqs = vec![random_ids(&mut rng, c.vocab, 9), random_ids(&mut rng, c.vocab, 9)];
    // Includes the last layer (pre-norm) and the first.
    check_against_reference(&c, &w, &model, &seqs, &[0, 1, 3]);
    // Input-of-layer id 0 is the embedding output.
    let req =
        CaptureRequest::with_aux(AuxLayers { ids: vec![0], convention: AuxConvention::InputOfLayer }, LogitsMode::None);
    let out = model.forward(ids(&seqs[..1]), &mut model.new_cache(), &req).unwrap();
    let r = ref_forward(&c, &w, &seqs[0], &(0..9).collect::<Vec<_>>());
    assert_close("embedding output", &rows(&out.aux[0])[0], &r.hidden_states[0]);
}

#[test]
fn llama_tied_llama3_rope_mqa_matches_reference() {
    let c = RefConfig {
        hidden: 48,
        heads: 4,
        kv_heads: 1,
        head_dim: 16,
        tied: true,
        theta: 10000.0,
        // Wavelengths 6.3, 20, 63, 199, ... cover the high, medium and low bands of orig 32.
        rope: RefRope::Llama3(4.0, 1.0, 4.0, 32.0),
        rope_parameters: true,
        ..RefConfig::llama_gqa()
    };
    let w = random_checkpoint(&c, 2, Dtype::F32);
    assert!(!w.contains_key("lm_head.weight"));
    let (_dir, model) = load(&c, &w);
    // The tied head is a copy of the embedding in the matmul layout: the same values.
    let head: Vec<f32> =
        model.lm_head.as_ref().expect("tied head copied").weight.val().into_data().iter::<f32>().collect();
    let emb: Vec<f32> = model.model.embed_tokens.weight.val().into_data().iter::<f32>().collect();
    assert_eq!(head, emb);
    let mut rng = Rng(8);
    check_against_reference(&c, &w, &model, &[random_ids(&mut rng, c.vocab, 40)], &[1, 2]);
}

#[test]
fn qwen2_biases_match_reference() {
    let c = RefConfig { model_type: "qwen2", qkv_bias: true, o_bias: false, theta: 1e6, ..RefConfig::llama_gqa() };
    let w = random_checkpoint(&c, 3, Dtype::F32);
    assert!(w.contains_key("model.layers.0.self_attn.q_proj.bias"));
    let (_dir, model) = load(&c, &w);
    let mut rng = Rng(9);
    check_against_reference(&c, &w, &model, &[random_ids(&mut rng, c.vocab, 11)], &[0, 2]);
}

#[test]
fn qwen3_qk_norm_matches_reference() {
    let c = RefConfig { model_type: "qwen3", qk_norm: true, tied: true, head_dim: 16, ..RefConfig::llama_gqa() };
    let w = random_checkpoint(&c, 4, Dtype::F32);
    let (_dir, model) = load(&c, &w);
    let mut rng = Rng(10);
    let seqs = vec![random_ids(&mut rng, c.vocab, 10), random_ids(&mut rng, c.vocab, 10)];
    check_against_reference(&c, &w, &model, &seqs, &[1, 2]);
}

#[test]
fn bf16_sharded_checkpoint_matches_reference() {
    let c = RefConfig { rope: RefRope::Linear(2.0), ..RefConfig::llama_gqa() };
    let w = random_checkpoint(&c, 5, Dtype::BF16);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), c.config_json().to_string()).unwrap();
    let (first, second): (TensorMap, TensorMap) =
        w.clone().into_iter().partition(|(k, _)| k.contains("layers.0.") || k.contains("embed"));
    let names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    write_safetensors(&dir.path().join(names[0]), &first).unwrap();
    write_safetensors(&dir.path().join(names[1]), &second).unwrap();
    let mut map = serde_json::Map::new();
    for (part, name) in [(&first, names[0]), (&second, names[1])] {
        for k in part.keys() {
            map.insert(k.clone(), serde_json::json!(name));
        }
    }
    std::fs::write(dir.path().join(INDEX_FILE), serde_json::json!({"metadata": {}, "weight_map": map}).to_string())
        .unwrap();
    let model = TargetModel::<B>::load(dir.path(), &Default::default()).unwrap();
    let mut rng = Rng(11);
    check_against_reference(&c, &w, &model, &[random_ids(&mut rng, c.vocab, 12)], &[2]);
    // Held as bf16, the model still runs and stays close (bf16 has 3 significant digits).
    let half = TargetModel::<B>::load_as(dir.path(), &Default::default(), DType::BF16).unwrap();
    let seq = random_ids(&mut rng, c.vocab, 6);
    let out = half.forward(ids(std::slice::from_ref(&seq)), &mut half.new_cache(), &CaptureRequest::default()).unwrap();
    let r = ref_forward(&c, &w, &seq, &(0..6).collect::<Vec<_>>());
    let e = rel_err(&rows(&out.logits.unwrap().cast(DType::F32))[0], &r.logits);
    assert!(e < 0.05, "bf16 logits relative error {e}");
}

#[test]
fn right_padded_batch_is_exact_at_real_positions() {
    let c = RefConfig::llama_gqa();
    let w = random_checkpoint(&c, 6, Dtype::F32);
    let (_dir, model) = load(&c, &w);
    let mut rng = Rng(12);
    let long = random_ids(&mut rng, c.vocab, 9);
    let short = random_ids(&mut rng, c.vocab, 5);
    let mut padded = short.clone();
    padded.extend([0; 4]);
    let out = model
        .forward(
            ids(&[long, padded]),
            &mut model.new_cache(),
            &CaptureRequest::with_aux(output_of(&[1]), LogitsMode::All),
        )
        .unwrap();
    let r = ref_forward(&c, &w, &short, &(0..5).collect::<Vec<_>>());
    assert_close("padded row logits", &rows(out.logits.as_ref().unwrap())[1][..5], &r.logits);
    assert_close("padded row aux", &rows(&out.aux[0])[1][..5], &r.hidden_states[2]);
}

/// Feed `seq` in pieces of the given sizes; returns the concatenated logits and aux rows.
fn feed(model: &TargetModel<B>, cache: &mut TargetCache<B>, seq: &[usize], pieces: &[usize]) -> (Mat, Mat) {
    let req = CaptureRequest::with_aux(output_of(&[1, 2]), LogitsMode::All);
    let (mut logits, mut aux) = (Vec::new(), Vec::new());
    let mut at = 0;
    for &n in pieces {
        let out = model.forward(ids(&[seq[at..at + n].to_vec()]), cache, &req).unwrap();
        logits.extend(rows(out.logits.as_ref().unwrap()).remove(0));
        aux.extend(rows(&out.aux_concat().unwrap()).remove(0));
        at += n;
    }
    assert_eq!(cache.len(), at);
    (logits, aux)
}

#[test]
fn incremental_decoding_matches_full_forward() {
    let c = RefConfig::llama_gqa();
    let w = random_checkpoint(&c, 13, Dtype::F32);
    let (_dir, model) = load(&c, &w);
    let seq = random_ids(&mut Rng(14), c.vocab, 12);
    let (full_logits, full_aux) = feed(&model, &mut model.new_cache(), &seq, &[12]);
    let r = ref_forward(&c, &w, &seq, &(0..12).collect::<Vec<_>>());
    assert_close("full logits", &full_logits, &r.logits);
    let mut cache = model.new_cache();
    let (inc_logits, inc_aux) = feed(&model, &mut cache, &seq, &[5, 1, 1, 1, 4]);
    assert_close("incremental logits", &inc_logits, &full_logits);
    assert_close("incremental aux", &inc_aux, &full_aux);
    // LogitsMode::Last gives the last row only.
    cache.truncate(11);
    let out = model.forward(ids(&[vec![seq[11]]]), &mut cache, &CaptureRequest::logits(LogitsMode::Last)).unwrap();
    assert_eq!(out.logits.as_ref().unwrap().dims(), [1, 1, c.vocab]);
    assert_close("last logits", &rows(out.logits.as_ref().unwrap())[0], &full_logits[11..]);
}

#[test]
fn truncate_rollback_then_refeed_matches_original() {
    let c = RefConfig { model_type: "qwen3", qk_norm: true, ..RefConfig::llama_gqa() };
    let w = random_checkpoint(&c, 15, Dtype::F32);
    let (_dir, model) = load(&c, &w);
    let mut rng = Rng(16);
    let seq = random_ids(&mut rng, c.vocab, 8);
    let mut cache = model.new_cache();
    let (orig, _) = feed(&model, &mut cache, &seq, &[8]);
    // Roll back 3 positions, feed wrong drafts, roll back again, feed the true tokens.
    cache.truncate(5);
    assert_eq!(cache.len(), 5);
    let wrong = random_ids(&mut rng, c.vocab, 3);
    model.forward(ids(&[wrong]), &mut cache, &CaptureRequest::logits(LogitsMode::None)).unwrap();
    assert_eq!(cache.len(), 8);
    cache.truncate(5);
    let out = model.forward(ids(&[seq[5..].to_vec()]), &mut cache, &CaptureRequest::default()).unwrap();
    assert_close("re-fed logits", &rows(out.logits.as_ref().unwrap())[0], &orig[5..]);
    // truncate past the end is a no-op; truncate(0) and reset() empty the cache.
    cache.truncate(100);
    assert_eq!(cache.len(), 8);
    cache.truncate(0);
    assert!(cache.is_empty());
    let (again, _) = feed(&model, &mut cache, &seq, &[3, 5]);
    assert_close("after truncate(0)", &again, &orig);
    cache.reset();
    assert!(cache.is_empty() && cache.batch_size() == 0);
}

#[test]
fn tree_verification_with_mask_matches_chains() {
    let c = RefConfig::llama_gqa();
    let w = random_checkpoint(&c, 17, Dtype::F32);
    let (_dir, model) = load(&c, &w);
    let mut rng = Rng(18);
    let prefix = random_ids(&mut rng, c.vocab, 6);
    let [a1, b1, a2, b2, x] = [0, 0, 0, 0, 0].map(|_| below(&mut rng, c.vocab));
    let mut cache = model.new_cache();
    model.forward(ids(std::slice::from_ref(&prefix)), &mut cache, &CaptureRequest::logits(LogitsMode::None)).unwrap();
    // Tree nodes in input order: a1, b1 (depth 0), a2 (child of a1), b2 (child of b1).
    let parent = [None, None, Some(0), Some(1)];
    let n = 4;
    let t = prefix.len() + n;
    let mut mask = vec![false; n * t];
    for i in 0..n {
        for j in 0..n {
            let mut anc = Some(i);
            let mut visible = false;
            while let Some(a) = anc {
                visible |= a == j;
                anc = parent[a];
            }
            mask[i * t + prefix.len() + j] = !visible;
        }
    }
    let mask = Tensor::<B, 4, Bool>::from_data(TensorData::new(mask, [1, 1, n, t]), &Default::default());
    let p = prefix.len();
    let out = model
        .forward_with_mask(
            ids(&[vec![a1, b1, a2, b2]]),
            vec![p, p, p + 1, p + 1],
            &mut cache,
            Some(mask),
            &CaptureRequest::default(),
        )
        .unwrap();
    let got = rows(out.logits.as_ref().unwrap()).remove(0);
    for (name, chain, nodes) in [("a", [a1, a2], [0, 2]), ("b", [b1, b2], [1, 3])] {
        let mut seq = prefix.clone();
        seq.extend(chain);
        let r = ref_forward(&c, &w, &seq, &(0..seq.len()).collect::<Vec<_>>());
        let picked: Mat = nodes.iter().map(|&i| got[i].clone()).collect();
        assert_close(&format!("branch {name}"), &picked, &r.logits[p..]);
    }
    // Accept branch b: keep the prefix and nodes 1 and 3, then continue decoding.
    let keep: Vec<usize> = (0..p).chain([p + 1, p + 3]).collect();
    cache.retain(&keep).unwrap();
    assert_eq!(cache.len(), p + 2);
    let out = model.forward(ids(&[vec![x]]), &mut cache, &CaptureRequest::default()).unwrap();
    let mut seq = prefix.clone();
    seq.extend([b1, b2, x]);
    let r = ref_forward(&c, &w, &seq, &(0..seq.len()).collect::<Vec<_>>());
    assert_close("after retain", &rows(out.logits.as_ref().unwrap())[0], &r.logits[p + 2..]);
    assert!(cache.retain(&[3, 2]).is_err() && cache.retain(&[99]).is_err());
}

#[test]
fn greedy_generate_matches_reference() {
    let c = RefConfig { tied: true, ..RefConfig::llama_gqa() };
    let w = random_checkpoint(&c, 19, Dtype::F32);
    let (_dir, model) = load(&c, &w);
    let prompt = random_ids(&mut Rng(20), c.vocab, 4);
    let (want, gap) = greedy(&c, &w, &prompt, 10, &[]);
    assert!(gap > 1e-3, "reference has a near tie ({gap}); pick another seed");
    let prompt32: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
    let got = model.generate(&prompt32, 10, &[]).unwrap();
    assert_eq!(got, want.iter().map(|&t| t as u32).collect::<Vec<_>>());
    // Stops after the first eos, which is included.
    let eos = got[3];
    let first = got.iter().position(|&t| t == eos).unwrap();
    assert_eq!(model.generate(&prompt32, 10, &[eos]).unwrap(), got[..=first].to_vec());
    assert!(model.generate(&[], 3, &[]).is_err());
}

#[test]
fn loader_and_forward_errors_are_clear() {
    let c = RefConfig::llama_gqa();
    let w = random_checkpoint(&c, 21, Dtype::F32);
    let dir = tempfile::tempdir().unwrap();
    let err = |w: &TensorMap, c: &RefConfig| {
        write_checkpoint(dir.path(), c, w);
        TargetModel::<B>::load(dir.path(), &Default::default()).unwrap_err().to_string()
    };
    // A missing key and a wrong shape, both reported, naming the file.
    let mut broken = w.clone();
    broken.remove("model.layers.2.mlp.up_proj.weight");
    let t = broken.get_mut("model.layers.1.self_attn.k_proj.weight").unwrap();
    t.shape = vec![t.shape[1], t.shape[0]];
    let e = err(&broken, &c);
    assert!(e.contains(SINGLE_FILE) && e.contains("missing tensor `model.layers.2.mlp.up_proj.weight`"), "{e}");
    assert!(e.contains("model.layers.1.self_attn.k_proj.weight") && e.contains("[32, 48]"), "{e}");
    // Qwen2 weights under a llama config: the biases are not silently ignored.
    let q = RefConfig { model_type: "qwen2", qkv_bias: true, ..c.clone() };
    let e = err(&random_checkpoint(&q, 22, Dtype::F32), &c);
    assert!(e.contains("unexpected tensor `model.layers.0.self_attn.q_proj.bias`"), "{e}");
    // An untied config without lm_head hints at tie_word_embeddings.
    let mut no_head = w.clone();
    no_head.remove("lm_head.weight");
    assert!(err(&no_head, &c).contains("tie_word_embeddings"));

    // Forward-time errors: ids outside the vocabulary, a batch that does not match the cache,
    // a mask of the wrong shape, an aux layer beyond the model.
    let (_d, model) = load(&c, &w);
    let mut cache = model.new_cache();
    let e = model.forward(ids(&[vec![c.vocab]]), &mut cache, &CaptureRequest::default()).unwrap_err();
    assert!(matches!(e, Error::Shape(ref m) if m.contains("vocabulary")), "{e}");
    model.forward(ids(&[vec![1, 2]]), &mut cache, &CaptureRequest::default()).unwrap();
    let e = model.forward(ids(&[vec![1], vec![2]]), &mut cache, &CaptureRequest::default()).unwrap_err();
    assert!(e.to_string().contains("reset"), "{e}");
    let bad = Tensor::<B, 4, Bool>::from_data(TensorData::new(vec![false; 2], [1, 1, 1, 2]), &Default::default());
    let e = model
        .forward_with_mask(ids(&[vec![1]]), vec![2], &mut cache, Some(bad), &CaptureRequest::default())
        .unwrap_err();
    assert!(e.to_string().contains("mask"), "{e}");
    let e = model
        .forward(ids(&[vec![1]]), &mut cache, &CaptureRequest::with_aux(output_of(&[4]), LogitsMode::None))
        .unwrap_err();
    assert!(e.to_string().contains("beyond"), "{e}");
    assert_eq!(cache.len(), 2, "failed forwards leave the cache alone");
}

/// Throughput of a SmolLM2-135M-shaped random target (30 layers, H 576, 9/3 heads of 64, I 1536,
/// V 49152) on this CPU. Run with
/// `cargo test -p aerie-model --test target -- --ignored --nocapture smollm2_shaped_throughput`.
#[test]
#[ignore = "benchmark: prints prefill and decode tokens/s"]
fn smollm2_shaped_throughput() {
    use std::time::Instant;
    let cfg = TargetConfig::smollm2_135m();
    let c = RefConfig {
        hidden: 576,
        inter: 1536,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        vocab: 49152,
        tied: true,
        ..RefConfig::llama_gqa()
    };
    let w = random_checkpoint(&c, 23, Dtype::BF16);
    let model = TargetModel::<B>::from_tensors(&cfg, &w, &Default::default(), DType::F32).unwrap();
    drop(w);
    let mut rng = Rng(24);
    for &(prompt_len, mode) in &[(128usize, LogitsMode::Last), (512, LogitsMode::Last), (512, LogitsMode::All)] {
        let prompt = random_ids(&mut rng, c.vocab, prompt_len);
        let mut cache = model.new_cache();
        let t0 = Instant::now();
        model.forward(ids(&[prompt]), &mut cache, &CaptureRequest::logits(mode)).unwrap();
        let dt = t0.elapsed().as_secs_f64();
        println!("prefill {prompt_len} tokens (logits {mode:?}): {dt:.3} s, {:.0} tokens/s", prompt_len as f64 / dt);
        if mode == LogitsMode::Last {
            let n = 32;
            let t0 = Instant::now();
            for _ in 0..n {
                let tok = below(&mut rng, c.vocab);
                model.forward(ids(&[vec![tok]]), &mut cache, &CaptureRequest::logits(LogitsMode::Last)).unwrap();
            }
            let dt = t0.elapsed().as_secs_f64();
            println!("decode after {prompt_len}: {n} tokens in {dt:.3} s, {:.1} tokens/s", n as f64 / dt);
        }
    }
}

/// Continuous batching (`BatchGenerator`): prompts of mixed lengths (one crossing the cache's
/// 64-column growth step), budgets and an eos that ends some sequences early, at batch sizes 1, 3
/// (sequences wait and take over finished rows) and 8 (all at once). Each sequence's tokens equal
/// batch-1 `generate`'s, and every logits row the picker saw equals the reference forward of that
/// sequence at that position (TOL), so positions, masks and the row bookkeeping are checked
/// numerically, not only through the argmax.
#[test]
fn batched_generation_matches_batch_one_and_the_reference() {
    use aerie_model::native::batch::{BatchGenerator, GenerationRequest, greedy, host_rows};
    use std::collections::BTreeMap;

    let c = RefConfig::llama_gqa();
    let w = random_checkpoint(&c, 23, Dtype::F32);
    let (_dir, model) = load(&c, &w);
    let mut rng = Rng(24);
    let lens = [1usize, 7, 3, 30, 12, 2, 65, 5];
    let budgets = [6usize, 9, 1, 4, 12, 70, 3, 8];
    let prompts: Vec<Vec<u32>> =
        lens.iter().map(|&n| random_ids(&mut rng, c.vocab, n).into_iter().map(|t| t as u32).collect()).collect();
    let free: Vec<Vec<u32>> = prompts.iter().zip(budgets).map(|(p, b)| model.generate(p, b, &[]).unwrap()).collect();
    // An eos that cuts the long sequence short: its 20th token.
    let eos = vec![free[5][20]];
    let want: Vec<Vec<u32>> = prompts.iter().zip(budgets).map(|(p, b)| model.generate(p, b, &eos).unwrap()).collect();
    assert!(want[5].len() <= 21, "the eos stops sequence 5 early");
    for max_batch in [1, 3, 8] {
        let mut generator = BatchGenerator::new(&model, max_batch, &eos).unwrap();
        for (i, (p, &b)) in prompts.iter().zip(&budgets).enumerate() {
            generator.push(GenerationRequest { id: i as u64, prompt: p.clone(), max_new_tokens: b }).unwrap();
        }
        let mut seen: BTreeMap<u64, Vec<Vec<f32>>> = BTreeMap::new();
        let mut pick = |ids: &[u64], logits: Tensor<B, 2>| {
            for (id, row) in ids.iter().zip(host_rows(logits.clone())?) {
                seen.entry(*id).or_default().push(row);
            }
            greedy(ids, logits)
        };
        let mut got = generator.run_to_end(&mut pick).unwrap();
        assert!(generator.is_idle());
        got.sort_by_key(|g| g.id);
        let tokens: Vec<Vec<u32>> = got.iter().map(|g| g.tokens.clone()).collect();
        assert_eq!(tokens, want, "batch {max_batch}: tokens differ from batch-1 generation");
        for (i, g) in got.iter().enumerate() {
            let seq: Vec<usize> =
                prompts[i].iter().chain(&g.tokens[..g.tokens.len() - 1]).map(|&t| t as usize).collect();
            let r = ref_forward(&c, &w, &seq, &(0..seq.len()).collect::<Vec<_>>());
            let rows: Vec<Vec<f64>> = seen[&(i as u64)].iter().map(|r| r.iter().map(|&v| v as f64).collect()).collect();
            assert_close(&format!("batch {max_batch}, sequence {i} logits"), &rows, &r.logits[prompts[i].len() - 1..]);
        }
    }
    let mut generator = BatchGenerator::new(&model, 2, &[]).unwrap();
    assert!(generator.push(GenerationRequest { id: 0, prompt: vec![], max_new_tokens: 3 }).is_err());
    assert!(generator.push(GenerationRequest { id: 0, prompt: vec![1], max_new_tokens: 0 }).is_err());
    assert!(BatchGenerator::new(&model, 0, &[]).is_err());
}

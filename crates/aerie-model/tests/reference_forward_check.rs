//! Self-checks of the f64 EAGLE-3 reference's forward pass, TTT steps and batch metrics
//! (`tests/reference/`): hand-computed tiny cases and structural properties (eagle3.md §1, §3);
//! the elementary operations, RoPE, fixtures and targets are checked in `reference_selfcheck.rs`.

#![allow(clippy::needless_range_loop)]

mod reference;

use aerie_model::checkpoint::{Dtype, HostTensor, TensorMap};
use aerie_model::{DrafterConfig, RopeScaling};
use reference::check::*;
use reference::*;

// ------------------------------------------------------------------------------------------------
// Forward
// ------------------------------------------------------------------------------------------------

#[test]
fn one_token_sequence_attention_is_the_value() {
    // L = 1: ids = [0], the only key is the position's own, so attention returns v exactly and RoPE
    // plays no part. Built here by hand from the weights with matvec/rmsnorm only.
    for (nbr, nout) in [(false, false), (true, false), (false, true)] {
        let mut cfg = tiny_config();
        cfg.norm_before_residual = nbr;
        cfg.norm_output = nout;
        cfg.rope.scaling = RopeScaling::Linear { factor: 3.0 };
        let wm = random_tiny_checkpoint(&cfg, 8);
        let w = RefWeights::load(&cfg, &wm);
        let s = random_sequence(&cfg, 1, 9);
        let r = run(&cfg, &wm, &s, 1);
        let eps = cfg.rms_norm_eps;
        let h0 = ref_matvec(&w.fc, &s.aux[0]);
        let mut x = ref_rmsnorm(&w.embed[0], &w.input_ln, eps);
        let hn = ref_rmsnorm(&h0, &w.hidden_norm, eps);
        x.extend_from_slice(&hn);
        let v = ref_matvec(&w.v, &x);
        // nH 4, nKV 2, d 6: heads 0,1 -> kv 0; heads 2,3 -> kv 1.
        let mut attn = Vec::new();
        for j in 0..4 {
            let g = j / 2;
            attn.extend_from_slice(&v[g * 6..(g + 1) * 6]);
        }
        let o = ref_matvec(&w.o, &attn);
        let res = if nbr { hn.clone() } else { h0.clone() };
        let h1: Vec<f64> = res.iter().zip(&o).map(|(a, b)| a + b).collect();
        let n = ref_rmsnorm(&h1, &w.post_ln, eps);
        let g = ref_matvec(&w.gate, &n);
        let u = ref_matvec(&w.up, &n);
        let act: Vec<f64> = g.iter().zip(&u).map(|(a, b)| a / (1.0 + (-a).exp()) * b).collect();
        let dn = ref_matvec(&w.down, &act);
        let h2: Vec<f64> = h1.iter().zip(&dn).map(|(a, b)| a + b).collect();
        assert_vec_close(&r.hidden_per_step[0][0], &h2, 1e-13, "hidden");
        let logits = ref_matvec(&w.lm_head, &ref_rmsnorm(&h2, &w.norm, eps));
        assert_vec_close(&r.logits_per_step[0][0], &logits, 1e-13, "logits");
        // m[L-1] = 0: nothing counts.
        assert_eq!((r.ce_sum[0], r.correct[0], r.m_count[0], r.pm_count[0], r.alpha_sum[0]), (0.0, 0.0, 0.0, 0.0, 0.0));
        // Two steps on one token run and stay finite.
        let r2 = run(&cfg, &wm, &s, 2);
        assert!(r2.logits_per_step[1][0].iter().all(|v| v.is_finite()));
    }
}

#[test]
fn two_token_sequence_by_hand() {
    // Step 0, position 1 of a 2-token sequence, computed by hand: two keys (position 0, RoPE the
    // identity; position 1, rotated by hand with inv_freq 1e4^(-2i/6)), scores scaled 1/sqrt(6),
    // query head j using kv head j / 2.
    let cfg = tiny_config();
    let wm = random_tiny_checkpoint(&cfg, 12);
    let w = RefWeights::load(&cfg, &wm);
    let s = random_sequence(&cfg, 2, 13);
    let r = run(&cfg, &wm, &s, 1);
    let eps = cfg.rms_norm_eps;
    let row = |id: usize, f: &[f64]| {
        let h = ref_matvec(&w.fc, f);
        let mut x = ref_rmsnorm(&w.embed[id], &w.input_ln, eps);
        x.extend(ref_rmsnorm(&h, &w.hidden_norm, eps));
        (h, ref_matvec(&w.q, &x), ref_matvec(&w.k, &x), ref_matvec(&w.v, &x))
    };
    // ids = x[1:] + [0]
    let (_, _, k0, v0) = row(s.ids[1] as usize, &s.aux[0]);
    let (h1, q1, k1, v1) = row(0, &s.aux[1]);
    let inv = [1.0, 10000f64.powf(-1.0 / 3.0), 10000f64.powf(-2.0 / 3.0)];
    let rot1 = |x: &[f64]| -> Vec<f64> {
        let mut o = vec![0.0; 6];
        for i in 0..3 {
            o[i] = x[i] * inv[i].cos() - x[i + 3] * inv[i].sin();
            o[i + 3] = x[i + 3] * inv[i].cos() + x[i] * inv[i].sin();
        }
        o
    };
    let mut attn = Vec::new();
    for j in 0..4 {
        let g = j / 2;
        let q = rot1(&q1[j * 6..j * 6 + 6]);
        let ka = &k0[g * 6..g * 6 + 6];
        let kb = rot1(&k1[g * 6..g * 6 + 6]);
        let sa = dot(&q, ka) / 6f64.sqrt();
        let sb = dot(&q, &kb) / 6f64.sqrt();
        let wa = sa.exp() / (sa.exp() + sb.exp());
        for c in 0..6 {
            attn.push(wa * v0[g * 6 + c] + (1.0 - wa) * v1[g * 6 + c]);
        }
    }
    let o = ref_matvec(&w.o, &attn);
    let hm: Vec<f64> = h1.iter().zip(&o).map(|(a, b)| a + b).collect();
    let n = ref_rmsnorm(&hm, &w.post_ln, eps);
    let g = ref_matvec(&w.gate, &n);
    let u = ref_matvec(&w.up, &n);
    let act: Vec<f64> = g.iter().zip(&u).map(|(a, b)| ref_silu(*a) * b).collect();
    let dn = ref_matvec(&w.down, &act);
    let h2: Vec<f64> = hm.iter().zip(&dn).map(|(a, b)| a + b).collect();
    assert_vec_close(&r.hidden_per_step[0][1], &h2, 1e-13, "position 1");
}

/// Copy of `w` whose kv projections have `rep` times as many heads, head g of the result being head
/// g / rep of `w` (HF repeat_kv = repeat_interleave).
fn repeat_kv_heads(w: &TensorMap, d: usize, rep: usize) -> TensorMap {
    let mut out = w.clone();
    for key in ["midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight"] {
        let (shape, vals) = mat_of(w, key);
        let (rows, cols) = (shape[0], shape[1]);
        let nkv = rows / d;
        let mut nv = Vec::new();
        for g in 0..nkv {
            for _ in 0..rep {
                nv.extend_from_slice(&vals[g * d * cols..(g + 1) * d * cols]);
            }
        }
        out.insert(key.into(), HostTensor::from_f32(vec![rows * rep, cols], &nv, Dtype::F32));
    }
    out
}

#[test]
fn gqa_equals_repeated_kv_heads() {
    for nkv in [1usize, 2] {
        let mut cfg = tiny_config();
        cfg.num_key_value_heads = nkv;
        let w = random_tiny_checkpoint(&cfg, 21);
        let s = random_sequence(&cfg, 7, 22);
        let gqa = run(&cfg, &w, &s, 3);
        let mut cfg_mha = cfg.clone();
        cfg_mha.num_key_value_heads = 4;
        let mha = run(&cfg_mha, &repeat_kv_heads(&w, 6, 4 / nkv), &s, 3);
        assert_ttt_close(&gqa, &mha, 1e-13, &format!("nKV {nkv}"));
    }
}

#[test]
fn one_hot_teacher_loss_is_minus_log_q() {
    let cfg = tiny_config();
    let w = random_tiny_checkpoint(&cfg, 31);
    let vocab = random_draft_vocab(&cfg, 31);
    let l = 8;
    let mut s = random_sequence(&cfg, l, 32);
    // TL[r] one-hot (in f64: exp(-1000) == 0) at target id vocab[hot[r]].
    let hot: Vec<usize> = (0..l).map(|r| (r * 7 + 3) % 24).collect();
    for r in 0..l {
        s.teacher_logits[r] = vec![0.0; 40];
        s.teacher_logits[r][vocab[hot[r]]] = 1000.0;
    }
    let r = run(&cfg, &w, &s, 3);
    let m: Vec<f64> = (0..l).map(|t| if t == l - 1 { 0.0 } else { s.loss_mask[t] }).collect();
    for k in 0..3 {
        let (mut ce, mut alpha, mut correct, mut pmc) = (0.0, 0.0, 0.0, 0.0);
        for t in 0..l {
            if t + k >= l {
                continue;
            }
            // pm_k[t] = m[t+k]; the teacher for position t+k is TL[t+k+1], one-hot at hot[t+k+1].
            let pm = m[t + k];
            let j = hot[(t + k + 1).min(l - 1)];
            let logq = ref_log_softmax(&r.logits_per_step[k][t]);
            ce += pm * -logq[j];
            alpha += pm * logq[j].exp();
            correct += pm * if ref_argmax(&logq) == j { 1.0 } else { 0.0 };
            pmc += pm;
        }
        assert_close(r.ce_sum[k], ce, 1e-13, "ce = -log q[target]");
        assert_close(r.alpha_sum[k], alpha, 1e-13, "alpha = q[target]");
        assert_eq!(r.correct[k], correct, "correct");
        assert_eq!(r.pm_count[k], pmc, "pm");
    }
}

#[test]
fn causality_and_step_prefix_consistency() {
    let mut cfg = tiny_config();
    cfg.rope.theta = 100.0;
    let w = random_tiny_checkpoint(&cfg, 41);
    let l = 8;
    let s = random_sequence(&cfg, l, 42);
    let base = run(&cfg, &w, &s, 3);
    // The last aux feature only influences position L-1, at every step.
    let mut s2 = s.clone();
    for v in s2.aux[l - 1].iter_mut() {
        *v = -*v + 0.5;
    }
    let r2 = run(&cfg, &w, &s2, 3);
    for k in 0..3 {
        for t in 0..l - 1 {
            assert_eq!(base.logits_per_step[k][t], r2.logits_per_step[k][t], "step {k} pos {t}");
        }
        assert_ne!(base.logits_per_step[k][l - 1], r2.logits_per_step[k][l - 1]);
    }
    // x[5] = ids[4]: step 0 sees it at position 4 (not before); step 1 sees it at position 3.
    let mut s3 = s.clone();
    s3.ids[5] = (s.ids[5] + 1) % 40;
    let r3 = run(&cfg, &w, &s3, 3);
    for t in 0..4 {
        assert_eq!(base.logits_per_step[0][t], r3.logits_per_step[0][t], "step 0 pos {t}");
    }
    assert_ne!(base.logits_per_step[0][4], r3.logits_per_step[0][4]);
    for t in 0..3 {
        assert_eq!(base.logits_per_step[1][t], r3.logits_per_step[1][t], "step 1 pos {t}");
    }
    assert_ne!(base.logits_per_step[1][3], r3.logits_per_step[1][3]);
    // Earlier steps do not depend on K.
    let r1 = run(&cfg, &w, &s, 1);
    assert_eq!(r1.logits_per_step[0], base.logits_per_step[0]);
    assert_eq!(r1.ce_sum[0], base.ce_sum[0]);
    let r4 = run(&cfg, &w, &s, 4);
    for k in 0..3 {
        assert_eq!(r4.logits_per_step[k], base.logits_per_step[k]);
        assert_eq!(r4.alpha_sum[k], base.alpha_sum[k]);
    }
}

#[test]
fn ttt_step_equals_causal_chain_serving_view() {
    // Step k at position t sees step-0 keys at 0..=t and its own diagonal keys of steps 1..k at
    // RoPE positions t+1..t+k: exactly a causal pass over the draft chain of length t+1+k at
    // consecutive positions, which is what serving computes. Checked for every (k, t).
    let yarn = plain_yarn(4.0, 16);
    for (variant, fc_norm, nout, nbr, scaling) in [
        ("plain", false, false, false, RopeScaling::Default),
        ("fc_norm+yarn", true, false, false, yarn.clone()),
        ("norm_output", false, true, false, RopeScaling::Default),
        (
            "norm_before_residual+llama3",
            false,
            false,
            true,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 16,
            },
        ),
    ] {
        let mut cfg = tiny_config();
        cfg.fc_norm = fc_norm;
        cfg.norm_output = nout;
        cfg.norm_before_residual = nbr;
        cfg.rope.theta = 50.0;
        cfg.rope.scaling = scaling;
        let wm = random_tiny_checkpoint(&cfg, 51);
        let w = RefWeights::load(&cfg, &wm);
        let l = 6;
        let kk = 4;
        let s = random_sequence(&cfg, l, 52);
        let r = run(&cfg, &wm, &s, kk);
        let sids: Vec<usize> = (0..l).map(|t| if t + 1 < l { s.ids[t + 1] as usize } else { 0 }).collect();
        let h0: Vec<Vec<f64>> = s.aux.iter().map(|f| ref_fc(&cfg, &w, f)).collect();
        let next_input = |h: &Vec<f64>| if nout { ref_rmsnorm(h, &w.norm, cfg.rms_norm_eps) } else { h.clone() };
        for k in 0..kk {
            for t in 0..l {
                let mut emb = Vec::new();
                let mut hid = Vec::new();
                let mut pos = Vec::new();
                for s0 in 0..=t {
                    emb.push(w.embed[sids[s0]].clone());
                    hid.push(h0[s0].clone());
                    pos.push(s0 as f64);
                }
                for j in 1..=k {
                    let id = if t + j < l { sids[t + j] } else { 0 };
                    emb.push(w.embed[id].clone());
                    hid.push(next_input(&r.hidden_per_step[j - 1][t]));
                    pos.push((t + j) as f64);
                }
                let out = ref_causal_layer(&cfg, &w, &emb, &hid, &pos);
                assert_vec_close(
                    out.last().unwrap(),
                    &r.hidden_per_step[k][t],
                    1e-12,
                    &format!("{variant} step {k} pos {t}"),
                );
                assert_vec_close(&ref_head(&cfg, &w, out.last().unwrap()), &r.logits_per_step[k][t], 1e-12, "logits");
            }
        }
    }
}

#[test]
fn variants_change_what_they_should() {
    let base_cfg = tiny_config();
    let mut all = base_cfg.clone();
    all.fc_norm = true;
    let w = random_tiny_checkpoint(&all, 61);
    let s = random_sequence(&base_cfg, 6, 62);
    let base = run(&base_cfg, &w, &s, 2);
    // norm_output: step 0 identical, step 1 differs.
    let mut c = base_cfg.clone();
    c.norm_output = true;
    let r = run(&c, &w, &s, 2);
    assert_eq!(r.logits_per_step[0], base.logits_per_step[0]);
    assert_ne!(r.logits_per_step[1], base.logits_per_step[1]);
    // norm_before_residual and fc_norm: step 0 differs.
    for c in [
        DrafterConfig { norm_before_residual: true, ..base_cfg.clone() },
        DrafterConfig { fc_norm: true, ..base_cfg.clone() },
    ] {
        let r = run(&c, &w, &s, 2);
        assert_ne!(r.logits_per_step[0], base.logits_per_step[0]);
    }
    // RoPE: position 0 of step 0 sees only itself, so the rope type cannot matter there; later
    // positions it must.
    let c = DrafterConfig {
        rope: aerie_model::RopeConfig { theta: 10000.0, scaling: RopeScaling::Linear { factor: 5.0 } },
        ..base_cfg.clone()
    };
    let r = run(&c, &w, &s, 1);
    assert_vec_close(&r.logits_per_step[0][0], &base.logits_per_step[0][0], 1e-14, "pos 0");
    assert_ne!(r.logits_per_step[0][3], base.logits_per_step[0][3]);
}

#[test]
fn alpha_and_accuracy_are_bounded() {
    let cfg = tiny_config();
    let w = random_tiny_checkpoint(&cfg, 71);
    for seed in 0..4 {
        let s = random_sequence(&cfg, 10, 100 + seed);
        let r = run(&cfg, &w, &s, 4);
        for k in 0..4 {
            assert!(r.alpha_sum[k] >= 0.0 && r.alpha_sum[k] <= r.pm_count[k] + 1e-12);
            assert!(r.correct[k] >= 0.0 && r.correct[k] <= r.pm_count[k]);
            assert!(r.pm_count[k] <= r.m_count[k]);
            assert!(r.ce_sum[k] >= 0.0 && r.ce_sum[k].is_finite());
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Batch metrics
// ------------------------------------------------------------------------------------------------

fn fake(ce: [f64; 2], correct: [f64; 2], m: [f64; 2], pm: [f64; 2], alpha: [f64; 2]) -> RefTtt {
    RefTtt {
        ce_sum: ce.to_vec(),
        correct: correct.to_vec(),
        m_count: m.to_vec(),
        pm_count: pm.to_vec(),
        alpha_sum: alpha.to_vec(),
        logits_per_step: Vec::new(),
        hidden_per_step: Vec::new(),
    }
}

#[test]
fn metrics_hand_computed() {
    let a = fake([4.0, 6.0], [2.0, 1.0], [4.0, 3.0], [3.0, 2.0], [1.5, 1.0]);
    let b = fake([2.0, 2.0], [2.0, 0.0], [4.0, 1.0], [3.0, 2.0], [1.5, 0.0]);
    let m = ref_metrics(&[a, b], 10);
    assert_vec_close(&m.loss_k, &[0.6, 0.8], 1e-15, "loss_k = Σce / N");
    assert_vec_close(&m.acc_k, &[0.5, 0.25], 1e-15, "acc_k = Σcorrect / Σm");
    assert_vec_close(&m.alpha_k, &[0.5, 0.25], 1e-15, "alpha_k = Σalpha / Σpm");
    assert_close(m.loss, 0.6 + 0.8 * 0.8, 1e-15, "loss = Σ 0.8^k loss_k");
    assert_close(m.simulated_accept_length, 1.0 + 0.5 + 0.5 * 0.25, 1e-15, "τ = 1 + Σ Π acc");
    // Empty masks give 0, not NaN.
    let z = ref_metrics(&[fake([0.0; 2], [0.0; 2], [0.0; 2], [0.0; 2], [0.0; 2])], 4);
    assert_eq!(z.acc_k, vec![0.0, 0.0]);
    assert_eq!(z.alpha_k, vec![0.0, 0.0]);
    assert_eq!(z.simulated_accept_length, 1.0);
}

#[test]
fn metrics_of_a_real_batch_are_sane() {
    let cfg = tiny_config();
    let w = random_tiny_checkpoint(&cfg, 81);
    let lens = [5usize, 9, 3];
    let runs: Vec<RefTtt> =
        lens.iter().enumerate().map(|(i, &l)| run(&cfg, &w, &random_sequence(&cfg, l, 90 + i as u64), 3)).collect();
    let m = ref_metrics(&runs, lens.iter().sum());
    let total_ce: f64 = runs.iter().map(|r| r.ce_sum[0]).sum();
    assert_close(m.loss_k[0], total_ce / 17.0, 1e-15, "padded batch divides by real positions");
    assert!(m.loss.is_finite() && m.loss > 0.0);
    assert!(m.acc_k.iter().all(|a| (0.0..=1.0).contains(a)));
    assert!(m.alpha_k.iter().all(|a| (0.0..=1.0).contains(a)));
    assert!(m.simulated_accept_length >= 1.0 && m.simulated_accept_length <= 4.0);
}

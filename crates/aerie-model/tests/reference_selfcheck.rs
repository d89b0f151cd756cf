//! Self-checks of the f64 EAGLE-3 reference (`tests/reference/mod.rs`): hand-computed tiny cases
//! and structural properties (eagle3.md §1, §3), so that the reference can be trusted as the
//! ground truth for the burn implementation.

#![allow(clippy::needless_range_loop)]

mod reference;

use aerie_model::checkpoint::Dtype;
use aerie_model::{DrafterConfig, RopeScaling};
use reference::check::*;
use reference::*;

const PI: f64 = std::f64::consts::PI;

// ------------------------------------------------------------------------------------------------
// Elementary ops
// ------------------------------------------------------------------------------------------------

#[test]
fn rmsnorm_hand_computed() {
    // mean(x^2) = (1 + 4 + 9 + 16) / 4 = 7.5
    let x = [1.0, 2.0, 3.0, 4.0];
    let r = 7.5f64.sqrt();
    assert_vec_close(&ref_rmsnorm(&x, &[1.0; 4], 0.0), &[1.0 / r, 2.0 / r, 3.0 / r, 4.0 / r], 1e-15, "w=1");
    assert_vec_close(&ref_rmsnorm(&x, &[1.0, 1.0, 2.0, 0.5], 0.0), &[1.0 / r, 2.0 / r, 6.0 / r, 2.0 / r], 1e-15, "w");
    // eps is added to the mean square, inside the sqrt: sqrt(7.5 + 0.5) = sqrt(8)
    let r8 = 8f64.sqrt();
    assert_vec_close(&ref_rmsnorm(&x, &[1.0; 4], 0.5), &[1.0 / r8, 2.0 / r8, 3.0 / r8, 4.0 / r8], 1e-15, "eps");
}

#[test]
fn softmax_logsoftmax_argmax() {
    let x = [1.0, 2.0, 3.0];
    let z = 1f64.exp() + 2f64.exp() + 3f64.exp();
    let p = ref_softmax(&x);
    assert_vec_close(&p, &[1f64.exp() / z, 2f64.exp() / z, 3f64.exp() / z], 1e-15, "softmax");
    assert_close(p.iter().sum(), 1.0, 1e-15, "sum");
    let lp = ref_log_softmax(&x);
    assert_vec_close(&lp.iter().map(|v| v.exp()).collect::<Vec<_>>(), &p, 1e-15, "exp(log_softmax)");
    assert_close(ref_logsumexp(&x), z.ln(), 1e-15, "lse");
    // Shift invariance and no overflow at large logits.
    let big = ref_softmax(&[1001.0, 1002.0, 1003.0]);
    assert_vec_close(&big, &p, 1e-12, "shifted");
    let onehot = ref_softmax(&[0.0, 1000.0, 0.0]);
    assert_eq!(onehot, vec![0.0, 1.0, 0.0]);
    let mut rng = SplitMix64(7);
    for n in [1usize, 2, 5, 37] {
        let v: Vec<f64> = (0..n).map(|_| rng.centered(5.0)).collect();
        assert_close(ref_softmax(&v).iter().sum(), 1.0, 1e-14, "random sum");
    }
    // Ties resolve to the first index.
    assert_eq!(ref_argmax(&[0.5, 2.0, 2.0, 1.0]), 1);
    assert_eq!(ref_argmax(&[3.0, 3.0]), 0);
    assert_eq!(ref_argmax(&[1.0; 5]), 0);
}

#[test]
fn silu_hand() {
    assert_eq!(ref_silu(0.0), 0.0);
    assert_close(ref_silu(1.0), 1.0 / (1.0 + (-1f64).exp()), 1e-15, "silu(1)");
    assert_close(ref_silu(-2.0), -2.0 / (1.0 + 2f64.exp()), 1e-15, "silu(-2)");
}

#[test]
fn teacher_from_hidden_hand() {
    let hidden = vec![vec![1.0, 2.0], vec![-1.0, 0.5]];
    let head = vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![1.0, 1.0]];
    let l = ref_teacher_from_hidden(&hidden, &head);
    assert_eq!(l, vec![vec![1.0, 2.0, 3.0], vec![-1.0, 0.5, -0.5]]);
}

// ------------------------------------------------------------------------------------------------
// RoPE
// ------------------------------------------------------------------------------------------------

fn cfg_with_rope(d: usize, theta: f64, scaling: RopeScaling) -> DrafterConfig {
    let mut c = tiny_config();
    c.head_dim = d;
    c.rope.theta = theta;
    c.rope.scaling = scaling;
    c
}

#[test]
fn rope_default_and_linear_inv_freq_hand() {
    let (f, s) = ref_rope_inv_freq(&cfg_with_rope(4, 10000.0, RopeScaling::Default));
    assert_vec_close(&f, &[1.0, 0.01], 1e-15, "d=4");
    assert_eq!(s, 1.0);
    let (f, _) = ref_rope_inv_freq(&cfg_with_rope(8, 10000.0, RopeScaling::Default));
    assert_vec_close(&f, &[1.0, 0.1, 0.01, 0.001], 1e-15, "d=8");
    let (f, s) = ref_rope_inv_freq(&cfg_with_rope(8, 10000.0, RopeScaling::Linear { factor: 4.0 }));
    assert_vec_close(&f, &[0.25, 0.025, 0.0025, 0.00025], 1e-15, "linear");
    assert_eq!(s, 1.0);
    // Linear scaling == positions divided by factor.
    let mut rng = SplitMix64(3);
    let x = rand_vec(&mut rng, 8);
    let (fd, _) = ref_rope_inv_freq(&cfg_with_rope(8, 10000.0, RopeScaling::Default));
    assert_vec_close(&ref_rope(&x, 37.0, &f, 1.0), &ref_rope(&x, 37.0 / 4.0, &fd, 1.0), 1e-12, "linear = pos/factor");
}

#[test]
fn rope_llama3_hand() {
    // d 8, theta 1e4: inv_freq [1, .1, .01, .001], wavelen 2π/f = [6.28, 62.8, 628.3, 6283].
    // orig 1024, low_freq_factor 1, high_freq_factor 4: low_wl 1024, high_wl 256.
    // i=0,1: wavelen < 256 -> unchanged; i=3: wavelen > 1024 -> f/8;
    // i=2: medium, s = (1024 / 628.3185 - 1) / 3 = 0.20992, (1 - s) f / 8 + s f.
    let scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 1024,
    };
    let (f, s) = ref_rope_inv_freq(&cfg_with_rope(8, 10000.0, scaling));
    let sm = (1024.0 / (2.0 * PI / 0.01) - 1.0) / 3.0;
    assert!((sm - 0.20992).abs() < 1e-4, "smooth factor {sm}");
    assert_vec_close(&f, &[1.0, 0.1, (1.0 - sm) * 0.01 / 8.0 + sm * 0.01, 0.001 / 8.0], 1e-14, "llama3");
    assert_eq!(s, 1.0);
}

#[test]
fn rope_yarn_hand() {
    // d 16, theta 1e4, orig 2048, factor 4, beta 32/1:
    // corr_dim(32) = 16 ln(2048 / (64π)) / (2 ln 1e4) = 2.016 -> floor 2
    // corr_dim(1)  = 16 ln(2048 / (2π))  / (2 ln 1e4) = 5.026 -> ceil 6
    // ramp over i in 0..8: (i - 2) / 4 clamped = [0, 0, 0, .25, .5, .75, 1, 1]
    // extrap factor = 1 - ramp = [1, 1, 1, .75, .5, .25, 0, 0]
    let yarn = |attention_factor, mscale, mscale_all_dim, factor| RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: 2048,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor,
        mscale,
        mscale_all_dim,
    };
    let (f, s) = ref_rope_inv_freq(&cfg_with_rope(16, 10000.0, yarn(None, None, None, 4.0)));
    let ef = [1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0];
    let expect: Vec<f64> = (0..8)
        .map(|i| {
            let base = 10000f64.powf(-((2 * i) as f64) / 16.0);
            base / 4.0 * (1.0 - ef[i]) + base * ef[i]
        })
        .collect();
    assert_vec_close(&f, &expect, 1e-14, "yarn inv_freq");
    assert_close(s, 0.1 * 4f64.ln() + 1.0, 1e-15, "yarn default attention factor");
    // Explicit attention_factor wins.
    let (_, s) = ref_rope_inv_freq(&cfg_with_rope(16, 10000.0, yarn(Some(1.5), Some(1.0), Some(0.5), 4.0)));
    assert_eq!(s, 1.5);
    // mscale / mscale_all_dim (DeepSeek): (0.1·1·ln 40 + 1) / (0.1·0.5·ln 40 + 1) = 1.36889 / 1.18444
    let (_, s) = ref_rope_inv_freq(&cfg_with_rope(16, 10000.0, yarn(None, Some(1.0), Some(0.5), 40.0)));
    let ln40 = 3.688_879_454_113_936;
    assert_close(s, (0.1 * ln40 + 1.0) / (0.05 * ln40 + 1.0), 1e-14, "mscale ratio");
    assert!((s - 1.155_72).abs() < 1e-4, "{s}");
    // Equal mscales cancel (DeepSeek-V3 config: mscale = mscale_all_dim = 1).
    let (_, s) = ref_rope_inv_freq(&cfg_with_rope(16, 10000.0, yarn(None, Some(1.0), Some(1.0), 40.0)));
    assert_close(s, 1.0, 1e-15, "equal mscales");
    // mscale without mscale_all_dim falls back to the default formula (HF `if mscale and mscale_all_dim`).
    let (_, s) = ref_rope_inv_freq(&cfg_with_rope(16, 10000.0, yarn(None, Some(0.7), None, 40.0)));
    assert_close(s, 0.1 * ln40 + 1.0, 1e-15, "mscale alone");
    // factor <= 1: attention factor 1 and inv_freq unchanged.
    let (f1, s) = ref_rope_inv_freq(&cfg_with_rope(16, 10000.0, yarn(None, None, None, 1.0)));
    let (fd, _) = ref_rope_inv_freq(&cfg_with_rope(16, 10000.0, RopeScaling::Default));
    assert_eq!(s, 1.0);
    assert_vec_close(&f1, &fd, 1e-15, "factor 1");
}

#[test]
fn rope_hand_rotation_pairs_i_with_i_plus_half() {
    // d 2, f 1, pos π/2: a quarter turn.
    assert_vec_close(&ref_rope(&[1.0, 0.0], PI / 2.0, &[1.0], 1.0), &[0.0, 1.0], 1e-15, "e0");
    assert_vec_close(&ref_rope(&[0.0, 1.0], PI / 2.0, &[1.0], 1.0), &[-1.0, 0.0], 1e-15, "e1");
    // d 4, f [1, 0.5], pos π: pair (0, 2) turns by π, pair (1, 3) by π/2 (rotate_half, not interleaved).
    assert_vec_close(&ref_rope(&[1.0, 0.0, 0.0, 0.0], PI, &[1.0, 0.5], 1.0), &[-1.0, 0.0, 0.0, 0.0], 1e-15, "pair 0-2");
    assert_vec_close(&ref_rope(&[0.0, 1.0, 0.0, 0.0], PI, &[1.0, 0.5], 1.0), &[0.0, 0.0, 0.0, 1.0], 1e-15, "pair 1-3");
    // Attention scaling multiplies cos and sin.
    assert_vec_close(&ref_rope(&[1.0, 0.0], PI / 2.0, &[1.0], 2.0), &[0.0, 2.0], 1e-15, "scaled");
}

#[test]
fn rope_position_zero_is_identity_and_norm_is_preserved() {
    let mut rng = SplitMix64(11);
    for scaling in [
        RopeScaling::Default,
        RopeScaling::Linear { factor: 2.0 },
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        },
        plain_yarn(4.0, 64),
    ] {
        let cfg = cfg_with_rope(12, 500.0, scaling.clone());
        let (f, s) = ref_rope_inv_freq(&cfg);
        let x = rand_vec(&mut rng, 12);
        let scaled: Vec<f64> = x.iter().map(|v| v * s).collect();
        assert_vec_close(&ref_rope(&x, 0.0, &f, s), &scaled, 1e-15, &format!("{scaling:?} pos 0"));
        for pos in [1.0, 7.0, 123.0, 4097.0] {
            let y = ref_rope(&x, pos, &f, 1.0);
            assert_close(dot(&y, &y), dot(&x, &x), 1e-12, "norm");
            let ys = ref_rope(&x, pos, &f, s);
            assert_close(dot(&ys, &ys), s * s * dot(&x, &x), 1e-12, "scaled norm");
        }
        // Relative: <rope(q, a), rope(k, b)> depends on a - b only (times scaling^2).
        let q = rand_vec(&mut rng, 12);
        let k = rand_vec(&mut rng, 12);
        let d1 = dot(&ref_rope(&q, 10.0, &f, s), &ref_rope(&k, 3.0, &f, s));
        let d2 = dot(&ref_rope(&q, 57.0, &f, s), &ref_rope(&k, 50.0, &f, s));
        assert_close(d1, d2, 1e-12, "relative");
        let d3 = dot(&ref_rope(&q, 7.0, &f, 1.0), &ref_rope(&k, 0.0, &f, 1.0));
        assert_close(d1, s * s * d3, 1e-12, "relative scaled");
    }
}

// ------------------------------------------------------------------------------------------------
// Fixtures
// ------------------------------------------------------------------------------------------------

#[test]
fn random_checkpoint_shapes_and_vocab_invariants() {
    let mut cfg = tiny_config();
    cfg.fc_norm = true;
    let w = random_tiny_checkpoint(&cfg, 5);
    let (h, ht, i, d) = (16, 12, 24, 6);
    let expect: Vec<(&str, Vec<usize>)> = vec![
        ("embed_tokens.weight", vec![40, h]),
        ("fc.weight", vec![h, 3 * ht]),
        ("fc_norm.0.weight", vec![ht]),
        ("fc_norm.1.weight", vec![ht]),
        ("fc_norm.2.weight", vec![ht]),
        ("midlayer.input_layernorm.weight", vec![h]),
        ("midlayer.hidden_norm.weight", vec![h]),
        ("midlayer.self_attn.q_proj.weight", vec![4 * d, 2 * h]),
        ("midlayer.self_attn.k_proj.weight", vec![2 * d, 2 * h]),
        ("midlayer.self_attn.v_proj.weight", vec![2 * d, 2 * h]),
        ("midlayer.self_attn.o_proj.weight", vec![h, 4 * d]),
        ("midlayer.post_attention_layernorm.weight", vec![h]),
        ("midlayer.mlp.gate_proj.weight", vec![i, h]),
        ("midlayer.mlp.up_proj.weight", vec![i, h]),
        ("midlayer.mlp.down_proj.weight", vec![h, i]),
        ("norm.weight", vec![h]),
        ("lm_head.weight", vec![24, h]),
        ("d2t", vec![24]),
        ("t2d", vec![40]),
    ];
    assert_eq!(w.len(), expect.len(), "keys: {:?}", w.keys().collect::<Vec<_>>());
    for (k, shape) in &expect {
        assert_eq!(&w[*k].shape, shape, "{k}");
    }
    assert_eq!(w["d2t"].dtype, Dtype::I64);
    assert_eq!(w["t2d"].dtype, Dtype::Bool);
    assert_eq!(w["fc.weight"].dtype, Dtype::F32);
    // eagle3.md §4 invariants: t2d.sum() == Vd, 0 <= i + d2t[i] < V, nonzero(t2d) == d2t + arange(Vd).
    let d2t = w["d2t"].to_i64("d2t").unwrap();
    let t2d = w["t2d"].to_i64("t2d").unwrap();
    assert_eq!(t2d.iter().sum::<i64>(), 24);
    let targets: Vec<i64> = d2t.iter().enumerate().map(|(j, o)| j as i64 + o).collect();
    let nonzero: Vec<i64> = (0..40).filter(|&t| t2d[t as usize] == 1).collect();
    assert_eq!(targets, nonzero);
    assert!(targets.windows(2).all(|p| p[0] < p[1]), "ascending");
    assert!(targets.iter().all(|&t| (0..40).contains(&t)));
    assert_eq!(targets.iter().map(|&t| t as usize).collect::<Vec<_>>(), random_draft_vocab(&cfg, 5));
    // Scales: weights std ~0.2 uniform, norms in [0.9, 1.1].
    let (_, fc) = mat_of(&w, "fc.weight");
    let a = 0.2 * 3f64.sqrt();
    assert!(fc.iter().all(|&v| (v as f64).abs() <= a));
    let var = fc.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / fc.len() as f64;
    assert!((var.sqrt() - 0.2).abs() < 0.03, "fc std {}", var.sqrt());
    let (_, n) = mat_of(&w, "norm.weight");
    assert!(n.iter().all(|&v| (0.9..=1.1).contains(&v)));
    // Deterministic in the seed, different across seeds; no fc_norm keys without fc_norm.
    assert_eq!(random_tiny_checkpoint(&cfg, 5), w);
    assert_ne!(random_tiny_checkpoint(&cfg, 6)["fc.weight"], w["fc.weight"]);
    cfg.fc_norm = false;
    let w2 = random_tiny_checkpoint(&cfg, 5);
    assert!(!w2.keys().any(|k| k.starts_with("fc_norm")));
    assert_eq!(w2["fc.weight"], w["fc.weight"], "tensor values do not depend on which other tensors exist");
    // Vd == V: identity mapping.
    cfg.draft_vocab_size = 40;
    let w3 = random_tiny_checkpoint(&cfg, 5);
    assert!(w3["d2t"].to_i64("d2t").unwrap().iter().all(|&o| o == 0));
    assert!(w3["t2d"].to_i64("t2d").unwrap().iter().all(|&b| b == 1));
}

// ------------------------------------------------------------------------------------------------
// Targets (eagle3.md §3 shift semantics)
// ------------------------------------------------------------------------------------------------

#[test]
fn targets_shift_once_and_mask_handling() {
    let cfg = tiny_config();
    let wm = random_tiny_checkpoint(&cfg, 1);
    let w = RefWeights::load(&cfg, &wm);
    let vocab = random_draft_vocab(&cfg, 1);
    let outside = (0..40).find(|t| !vocab.contains(t)).unwrap();
    // L = 4. Teacher row r has its argmax at `hot[r]`.
    let hot = [vocab[0], vocab[5], outside, vocab[23]];
    let tl: Vec<Vec<f64>> = (0..4)
        .map(|r| {
            let mut row: Vec<f64> = (0..40).map(|v| (v as f64 * 0.37 + r as f64).sin()).collect();
            row[hot[r]] = 5.0;
            row
        })
        .collect();
    let x = [7i64, 11, 13, 17];
    let tg = ref_targets(&cfg, &w, &x, &[1.0, 1.0, 1.0, 1.0], &tl);
    assert_eq!(tg.ids, vec![11, 13, 17, 0], "ids = x[1:] + [0]");
    assert_eq!(tg.m, vec![1.0, 1.0, 1.0, 0.0], "m[L-1] = 0, not shifted");
    // pm[t] = m[t] * t2d[argmax TL[t+1]]: TL[2] has its argmax outside the draft vocab -> pm[1] = 0.
    assert_eq!(tg.pm, vec![1.0, 0.0, 1.0, 0.0]);
    // p[t] = softmax over draft ids of TL[t+1]; pf normalised over the full vocab.
    for t in 0..3 {
        let restricted: Vec<f64> = (0..24).map(|j| tl[t + 1][vocab[j]]).collect();
        assert_vec_close(&tg.p[t], &ref_softmax(&restricted), 1e-15, "p");
        let lse = ref_logsumexp(&tl[t + 1]);
        let pf: Vec<f64> = restricted.iter().map(|v| (v - lse).exp()).collect();
        assert_vec_close(&tg.pf[t], &pf, 1e-15, "pf");
        assert!(tg.pf[t].iter().sum::<f64>() < 1.0, "16 target ids are outside the draft vocab");
    }
    assert_eq!(ref_argmax(&tg.p[0]), 5, "p[0] is TL[1], hot at draft id 5");
    assert_eq!(ref_argmax(&tg.p[2]), 23);
    // t = L-1: the zero row: p uniform over Vd, pf = 1/V.
    assert_vec_close(&tg.p[3], &[1.0 / 24.0; 24], 1e-15, "p[L-1]");
    assert_vec_close(&tg.pf[3], &[1.0 / 40.0; 24], 1e-15, "pf[L-1]");
    // With Vd == V, pf == p.
    let mut cfg_full = cfg.clone();
    cfg_full.draft_vocab_size = 40;
    let wf = RefWeights::load(&cfg_full, &random_tiny_checkpoint(&cfg_full, 1));
    let tg = ref_targets(&cfg_full, &wf, &x, &[1.0; 4], &tl);
    for t in 0..4 {
        assert_vec_close(&tg.pf[t], &tg.p[t], 1e-14, "pf == p when Vd == V");
    }
}

#[test]
fn first_token_and_first_teacher_row_are_never_used() {
    let cfg = tiny_config();
    let w = random_tiny_checkpoint(&cfg, 2);
    let s = random_sequence(&cfg, 9, 3);
    let base = run(&cfg, &w, &s, 3);
    let mut s2 = s.clone();
    s2.ids[0] = (s.ids[0] + 1) % 40;
    s2.teacher_logits[0] = vec![0.0; 40];
    s2.teacher_logits[0][s.ids[0] as usize] = 100.0;
    assert_ttt_close(&base, &run(&cfg, &w, &s2, 3), 0.0, "x[0], TL[0] changed");
}

#[test]
fn loss_mask_counts_shift_left_per_step() {
    let cfg = tiny_config();
    let w = random_tiny_checkpoint(&cfg, 4);
    let vocab = random_draft_vocab(&cfg, 4);
    let l = 5;
    let mut s = random_sequence(&cfg, l, 4);
    s.loss_mask = vec![1.0; l];
    // Teacher argmax inside the draft vocab everywhere: pm == m.
    for t in 0..l {
        s.teacher_logits[t][vocab[t]] = 50.0;
    }
    let r = run(&cfg, &w, &s, 5);
    // m = [1, 1, 1, 1, 0]; m_k = m shifted left by k.
    assert_eq!(r.m_count, vec![4.0, 3.0, 2.0, 1.0, 0.0]);
    assert_eq!(r.pm_count, vec![4.0, 3.0, 2.0, 1.0, 0.0]);
    assert_eq!(r.ce_sum[4], 0.0);
    // One teacher row outside the draft vocab: TL[2] -> position 1 at step 0, position 0 at step 1.
    let outside = (0..40).find(|t| !vocab.contains(t)).unwrap();
    s.teacher_logits[2][outside] = 100.0;
    let r = run(&cfg, &w, &s, 5);
    assert_eq!(r.m_count, vec![4.0, 3.0, 2.0, 1.0, 0.0]);
    assert_eq!(r.pm_count, vec![3.0, 2.0, 2.0, 1.0, 0.0]);
}

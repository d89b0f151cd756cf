//! Training-time test (eagle3.md §3): the shifted targets, the TTT steps and their metrics.

#![allow(dead_code)]
#![allow(clippy::needless_range_loop)]

use aerie_model::DrafterConfig;
use aerie_model::checkpoint::TensorMap;

use super::*;

// ------------------------------------------------------------------------------------------------
// Training-time test
// ------------------------------------------------------------------------------------------------

/// Per-step sums of one sequence's TTT metrics (eagle3.md §3), un-normalised so sequences can be
/// summed before dividing (see [`ref_metrics`]).
#[derive(Debug, Clone, Default)]
pub struct RefTtt {
    /// `Σ_t pm_k[t] * -(Σ_j p_k[t][j] * logq_k[t][j])`.
    pub ce_sum: Vec<f64>,
    /// `Σ_t pm_k[t] * [argmax logq_k[t] == argmax p_k[t]]`.
    pub correct: Vec<f64>,
    /// `Σ_t m_k[t]`.
    pub m_count: Vec<f64>,
    /// `Σ_t pm_k[t]`.
    pub pm_count: Vec<f64>,
    /// `Σ_t pm_k[t] * Σ_j min(pf_k[t][j], exp(logq_k[t][j]))`.
    pub alpha_sum: Vec<f64>,
    /// Drafter logits `lm_head(norm(h))` per step: [K][L][Vd].
    pub logits_per_step: Vec<Mat>,
    /// Layer output h per step, BEFORE the final norm (even with `norm_output`): [K][L][H].
    pub hidden_per_step: Vec<Mat>,
}

/// The shifted TTT targets of one sequence (eagle3.md §3, "shift once, never twice").
#[derive(Debug, Clone)]
pub struct RefTargets {
    /// `ids = x[1:] + [0]`.
    pub ids: Vec<i64>,
    /// `m` with `m[L-1] = 0` (NOT shifted).
    pub m: Vec<f64>,
    /// `pm[t] = m[t] * t2d[argmax_v T[t][v]]`.
    pub pm: Vec<f64>,
    /// `p[t][j] = softmax_j T[t][target_id(j)]`, [L][Vd], indexed by draft id.
    pub p: Mat,
    /// `pf[t][j] = exp(T[t][target_id(j)] - logsumexp_v T[t][v])`, [L][Vd].
    pub pf: Mat,
}

/// Build the shifted targets: `T = TL[1:] + [zero row]`, then `m`, `pm`, `p`, `pf` as documented
/// on [`RefTargets`]. At t = L-1 T is the zero row (p uniform 1/Vd, pf = 1/V) and m = pm = 0.
///
/// CHOICE: p and pf are indexed by draft id j (the lm_head row). With a valid d2t (§4: draft ids
/// sorted by target id) this is the "ascending target-id order" of §3.
pub fn ref_targets(
    cfg: &DrafterConfig,
    w: &RefWeights,
    ids: &[i64],
    loss_mask: &[f64],
    teacher_logits: &[Vec<f64>],
) -> RefTargets {
    let l = ids.len();
    let v = cfg.vocab_size;
    let vd = cfg.draft_vocab_size;
    assert!(l >= 1, "empty sequence");
    assert_eq!(loss_mask.len(), l, "loss_mask length");
    assert_eq!(teacher_logits.len(), l, "teacher_logits length");
    let mut sids = vec![0i64; l];
    let mut tshift: Mat = Vec::with_capacity(l);
    for t in 0..l {
        if t + 1 < l {
            sids[t] = ids[t + 1];
            assert_eq!(teacher_logits[t + 1].len(), v, "teacher logits must span the full vocab V");
            tshift.push(teacher_logits[t + 1].clone());
        } else {
            sids[t] = 0;
            tshift.push(vec![0.0; v]);
        }
    }
    let mut m = loss_mask.to_vec();
    m[l - 1] = 0.0;
    let mut pm = vec![0.0; l];
    let mut p = Vec::with_capacity(l);
    let mut pf = Vec::with_capacity(l);
    for t in 0..l {
        let a = ref_argmax(&tshift[t]);
        pm[t] = m[t] * if w.t2d[a] { 1.0 } else { 0.0 };
        let mut restricted = vec![0.0; vd];
        for j in 0..vd {
            restricted[j] = tshift[t][w.target_id(j)];
        }
        p.push(ref_softmax(&restricted));
        let lse = ref_logsumexp(&tshift[t]);
        pf.push(restricted.iter().map(|&x| (x - lse).exp()).collect());
    }
    RefTargets { ids: sids, m, pm, p, pf }
}

/// Training-time test of ONE sequence, exactly eagle3.md §3.
///
/// * `ids` = x (len L, target token ids), `loss_mask` (len L, 0/1), `aux` = f [L][A*Ht],
///   `teacher_logits` = TL [L][V] (full vocab, unshifted), `ttt_length` = K.
/// * `h = fc(f)`; for k in 0..K: `h = layer(embed(ids_k), h)`, logits = lm_head(norm(h)).
/// * Step k, position t: the query is RoPE'd at position t+k; it sees the step-0 keys/values at
///   positions s <= t (RoPE'd at s when created) and the keys/values of steps 1..k at the SAME
///   position t (step j's RoPE'd at t+j); one softmax over those t+1+k scores, scale 1/sqrt(d).
/// * Embedding input at step k, position t: `ids[t+k]` (0 past the end): shift_left after each step.
/// * Next step input: h (pre-norm), or norm(h) when `norm_output`; h is never shifted in time.
/// * Metrics at step k use `p_k[t] = p[t+k]` (uniform 1/Vd past the end), `pf_k[t] = pf[t+k]`
///   (0 past the end), `pm_k[t] = pm[t+k]`, `m_k[t] = m[t+k]` (0 past the end).
pub fn ref_ttt(
    cfg: &DrafterConfig,
    weights: &TensorMap,
    ids: &[i64],
    loss_mask: &[f64],
    aux: &[Vec<f64>],
    teacher_logits: &[Vec<f64>],
    ttt_length: usize,
) -> RefTtt {
    let w = RefWeights::load(cfg, weights);
    let l = ids.len();
    let vd = cfg.draft_vocab_size;
    assert_eq!(aux.len(), l, "aux length");
    for &x in ids {
        assert!(x >= 0 && (x as usize) < cfg.vocab_size, "token id {x} outside the target vocab");
    }
    let tg = ref_targets(cfg, &w, ids, loss_mask, teacher_logits);
    let (inv_freq, scaling) = ref_rope_inv_freq(cfg);

    // h = fc(f)
    let mut h: Mat = aux.iter().map(|f| ref_fc(cfg, &w, f)).collect();

    // Step-0 keys/values per position, and the diagonal keys/values of later steps:
    // cache_k[j][t] = k heads produced at step j, position t.
    let mut cache_k: Vec<Vec<Mat>> = Vec::new();
    let mut cache_v: Vec<Vec<Mat>> = Vec::new();

    let mut out = RefTtt {
        ce_sum: vec![0.0; ttt_length],
        correct: vec![0.0; ttt_length],
        m_count: vec![0.0; ttt_length],
        pm_count: vec![0.0; ttt_length],
        alpha_sum: vec![0.0; ttt_length],
        logits_per_step: Vec::new(),
        hidden_per_step: Vec::new(),
    };

    for k in 0..ttt_length {
        // Projections of every position at this step (RoPE position t + k).
        let mut residuals = Vec::with_capacity(l);
        let mut qs = Vec::with_capacity(l);
        let mut ks = Vec::with_capacity(l);
        let mut vs = Vec::with_capacity(l);
        for t in 0..l {
            let id = if t + k < l { tg.ids[t + k] } else { 0 };
            let emb = &w.embed[id as usize];
            let (r, q, kk, vv) = project_row(cfg, &w, emb, &h[t], (t + k) as f64, &inv_freq, scaling);
            residuals.push(r);
            qs.push(q);
            ks.push(kk);
            vs.push(vv);
        }
        cache_k.push(ks);
        cache_v.push(vs);

        // Attention + MLP per position.
        let mut h_out: Mat = Vec::with_capacity(l);
        for t in 0..l {
            let mut keys: Vec<&Mat> = Vec::new();
            let mut values: Vec<&Mat> = Vec::new();
            for s in 0..=t {
                keys.push(&cache_k[0][s]);
                values.push(&cache_v[0][s]);
            }
            for j in 1..=k {
                keys.push(&cache_k[j][t]);
                values.push(&cache_v[j][t]);
            }
            let attn = attend(cfg, &qs[t], &keys, &values);
            h_out.push(finish_row(cfg, &w, &residuals[t], &attn));
        }

        // Head and metrics.
        let uniform = vec![1.0 / vd as f64; vd];
        let zeros = vec![0.0; vd];
        let mut logits_k = Vec::with_capacity(l);
        for t in 0..l {
            let logits = ref_head(cfg, &w, &h_out[t]);
            let logq = ref_log_softmax(&logits);
            let in_range = t + k < l;
            let p_k = if in_range { &tg.p[t + k] } else { &uniform };
            let pf_k = if in_range { &tg.pf[t + k] } else { &zeros };
            let pm_k = if in_range { tg.pm[t + k] } else { 0.0 };
            let m_k = if in_range { tg.m[t + k] } else { 0.0 };
            let mut cross = 0.0;
            let mut overlap = 0.0;
            for j in 0..vd {
                cross += p_k[j] * logq[j];
                overlap += pf_k[j].min(logq[j].exp());
            }
            out.ce_sum[k] += pm_k * -cross;
            if ref_argmax(&logq) == ref_argmax(p_k) {
                out.correct[k] += pm_k;
            }
            out.m_count[k] += m_k;
            out.pm_count[k] += pm_k;
            out.alpha_sum[k] += pm_k * overlap;
            logits_k.push(logits);
        }
        out.logits_per_step.push(logits_k);

        // The next step consumes h (pre-norm), or norm(h) with norm_output (EAGLE-3.1).
        h = if cfg.norm_output {
            h_out.iter().map(|x| ref_rmsnorm(x, &w.norm, cfg.rms_norm_eps)).collect()
        } else {
            h_out.clone()
        };
        out.hidden_per_step.push(h_out);
    }
    out
}

/// Batch-level TTT metrics (eagle3.md §3).
#[derive(Debug, Clone, PartialEq)]
pub struct RefMetrics {
    /// `loss_k = Σ ce_sum_k / N_positions`.
    pub loss_k: Vec<f64>,
    /// `acc_k = Σ correct_k / Σ m_count_k` (0 when the denominator is 0).
    pub acc_k: Vec<f64>,
    /// `alpha_k = Σ alpha_sum_k / Σ pm_count_k` (0 when the denominator is 0).
    pub alpha_k: Vec<f64>,
    /// `Σ_k 0.8^k loss_k`.
    pub loss: f64,
    /// Conditional-rate accept length (§6, EAGLE paper): `1 + Σ_k Π_{i<=k} acc_i`.
    pub simulated_accept_length: f64,
}

/// Combine per-sequence sums. `n_positions` is the number of token positions, B*L for an
/// unpadded batch, the sum of real lengths for a padded one (eagle3.md §3 divides the loss by B*L).
///
/// CHOICE: a zero denominator (no masked positions) gives 0 rather than NaN; no epsilon is added
/// (SpecForge adds 1e-6 to the accuracy denominator; the spec does not).
pub fn ref_metrics(batch: &[RefTtt], n_positions: usize) -> RefMetrics {
    let k_len = batch.first().map(|r| r.ce_sum.len()).unwrap_or(0);
    let mut loss_k = vec![0.0; k_len];
    let mut acc_k = vec![0.0; k_len];
    let mut alpha_k = vec![0.0; k_len];
    for k in 0..k_len {
        let (mut ce, mut correct, mut m, mut pm, mut alpha) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for r in batch {
            assert_eq!(r.ce_sum.len(), k_len, "sequences with different ttt_length");
            ce += r.ce_sum[k];
            correct += r.correct[k];
            m += r.m_count[k];
            pm += r.pm_count[k];
            alpha += r.alpha_sum[k];
        }
        loss_k[k] = if n_positions > 0 { ce / n_positions as f64 } else { 0.0 };
        acc_k[k] = if m > 0.0 { correct / m } else { 0.0 };
        alpha_k[k] = if pm > 0.0 { alpha / pm } else { 0.0 };
    }
    let mut loss = 0.0;
    let mut w = 1.0;
    for k in 0..k_len {
        loss += w * loss_k[k];
        w *= 0.8;
    }
    let mut accept = 1.0;
    let mut prod = 1.0;
    for k in 0..k_len {
        prod *= acc_k[k];
        accept += prod;
    }
    RefMetrics { loss_k, acc_k, alpha_k, loss, simulated_accept_length: accept }
}

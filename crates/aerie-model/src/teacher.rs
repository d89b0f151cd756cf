//! The training teacher: the target's next-token distribution restricted to the draft vocabulary
//! (eagle3.md §2–3), computed from stored final hidden states and the target lm_head, or from
//! stored top-k log-probabilities.
//!
//! The full-vocabulary pass (log-partition and argmax over V) runs in row chunks of the head with
//! an online log-sum-exp, so a 163840-row head never materialises `[L, V]` float32 logits.

use burn::tensor::{Int, Tensor, TensorData, activation::softmax, backend::Backend};

use crate::layers::{mm, upcast};
use crate::vocab::VocabMap;

/// Per-position teacher quantities, aligned with the captured tokens: row `t` describes the
/// target's distribution of token `t + 1` (the TTT forward applies the one shift).
#[derive(Debug, Clone)]
pub struct TeacherTargets<B: Backend> {
    /// Softmax over the draft ids only `[B, L, Vd]` (the soft-CE target p).
    pub p: Tensor<B, 3>,
    /// Draft-id probabilities normalised over the FULL vocabulary `[B, L, Vd]` (pf, for α).
    pub pf: Tensor<B, 3>,
    /// 1 where the full-vocabulary argmax is in the draft vocabulary, else 0 `[B, L]`.
    pub in_draft: Tensor<B, 2>,
}

/// The target lm_head prepared for teacher computation.
#[derive(Debug, Clone)]
pub struct TargetHead<B: Backend> {
    weight: Tensor<B, 2>,
    draft_rows: Tensor<B, 2>,
    t2d: Tensor<B, 1>,
    chunk_rows: usize,
}

impl<B: Backend> TargetHead<B> {
    /// `weight: [V, Ht]` (lm_head, or the tied embedding); `chunk_rows` bounds the `[N, chunk]`
    /// logits block of the full-vocabulary pass.
    pub fn new(weight: Tensor<B, 2>, vocab: &VocabMap, chunk_rows: usize) -> Self {
        let device = weight.device();
        let ids: Vec<i64> = vocab.target_ids().iter().map(|&t| t as i64).collect();
        let n = ids.len();
        let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), &device);
        let draft_rows = weight.clone().select(0, idx);
        let t2d: Vec<f32> = vocab.t2d().iter().map(|&b| b as u8 as f32).collect();
        let v = t2d.len();
        let t2d = Tensor::from_data(TensorData::new(t2d, [v]), &device);
        Self { weight, draft_rows, t2d, chunk_rows: chunk_rows.max(1) }
    }

    /// Target vocabulary size V.
    pub fn vocab_size(&self) -> usize {
        self.weight.dims()[0]
    }

    /// Target hidden size Ht.
    pub fn hidden_size(&self) -> usize {
        self.weight.dims()[1]
    }

    /// Teacher targets for final hidden states `[B, L, Ht]`.
    pub fn targets(&self, final_hidden: Tensor<B, 3>) -> TeacherTargets<B> {
        let [b, l, ht] = final_hidden.dims();
        let x = final_hidden.reshape([b * l, ht]);
        let (log_z, argmax) = self.full_vocab_stats(x.clone());
        let x = upcast(x);
        let draft = mm::matmul(x.clone(), self.draft_rows.clone().cast(x.dtype()).transpose());
        let vd = draft.dims()[1];
        let p = softmax(draft.clone(), 1);
        let pf = (draft - log_z).exp();
        let in_draft = self.t2d.clone().select(0, argmax).cast(x.dtype());
        TeacherTargets { p: p.reshape([b, l, vd]), pf: pf.reshape([b, l, vd]), in_draft: in_draft.reshape([b, l]) }
    }

    /// Full-vocabulary log-partition `[N, 1]` and argmax `[N]` (first index on ties), chunked.
    fn full_vocab_stats(&self, x: Tensor<B, 2>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let [n, _] = x.dims();
        let x = upcast(x);
        let v = self.vocab_size();
        let mut run_max: Option<Tensor<B, 2>> = None;
        let mut run_sum: Option<Tensor<B, 2>> = None;
        let mut run_arg: Option<Tensor<B, 2, Int>> = None;
        let mut start = 0;
        while start < v {
            let rows = self.chunk_rows.min(v - start);
            let w = self.weight.clone().narrow(0, start, rows).cast(x.dtype());
            let logits = mm::matmul(x.clone(), w.transpose());
            let (cmax, carg) = logits.clone().max_dim_with_indices(1);
            let carg = carg.add_scalar(start as i64);
            match (run_max.take(), run_sum.take(), run_arg.take()) {
                (Some(m), Some(s), Some(a)) => {
                    let better = cmax.clone().greater(m.clone());
                    let new_max = m.clone().max_pair(cmax);
                    let s = s * (m - new_max.clone()).exp() + (logits - new_max.clone()).exp().sum_dim(1);
                    run_arg = Some(a.mask_where(better, carg));
                    run_max = Some(new_max);
                    run_sum = Some(s);
                }
                _ => {
                    run_sum = Some((logits - cmax.clone()).exp().sum_dim(1));
                    run_max = Some(cmax);
                    run_arg = Some(carg);
                }
            }
            start += rows;
        }
        let log_z = run_max.expect("V > 0") + run_sum.expect("V > 0").log();
        (log_z, run_arg.expect("V > 0").reshape([n]))
    }
}

/// Teacher targets from stored top-k log-probabilities over the full vocabulary (shard field
/// `teacher_topk_*`, rows descending). Ids outside the top k get probability 0: `pf` is exact on
/// the stored ids, `p` renormalises them over the draft vocabulary (uniform if none is in it).
pub fn targets_from_topk<B: Backend>(
    topk_ids: &[i32],
    topk_logprobs: &[f32],
    k: usize,
    shape: [usize; 2],
    vocab: &VocabMap,
    device: &B::Device,
) -> TeacherTargets<B> {
    let [b, l] = shape;
    let vd = vocab.draft_vocab_size();
    let mut draft_index = std::collections::HashMap::with_capacity(vd);
    for (j, &t) in vocab.target_ids().iter().enumerate() {
        draft_index.insert(t as i32, j);
    }
    let mut p = vec![0f32; b * l * vd];
    let mut pf = vec![0f32; b * l * vd];
    let mut in_draft = vec![0f32; b * l];
    for row in 0..b * l {
        let ids = &topk_ids[row * k..(row + 1) * k];
        let lps = &topk_logprobs[row * k..(row + 1) * k];
        let out = &mut pf[row * vd..(row + 1) * vd];
        let (best, _) = ids
            .iter()
            .zip(lps)
            .fold((ids[0], f32::NEG_INFINITY), |acc, (&id, &lp)| if lp > acc.1 { (id, lp) } else { acc });
        in_draft[row] = vocab.contains(best as usize) as u8 as f32;
        for (&id, &lp) in ids.iter().zip(lps) {
            if let Some(&j) = draft_index.get(&id) {
                out[j] = lp.exp();
            }
        }
        let total: f32 = out.iter().sum();
        let dst = &mut p[row * vd..(row + 1) * vd];
        if total > 0.0 {
            dst.iter_mut().zip(out.iter()).for_each(|(d, &s)| *d = s / total);
        } else {
            dst.fill(1.0 / vd as f32);
        }
    }
    TeacherTargets {
        p: Tensor::from_data(TensorData::new(p, [b, l, vd]), device),
        pf: Tensor::from_data(TensorData::new(pf, [b, l, vd]), device),
        in_draft: Tensor::from_data(TensorData::new(in_draft, [b, l]), device),
    }
}

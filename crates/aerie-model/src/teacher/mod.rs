//! The training teacher: the target's next-token distribution restricted to the draft vocabulary
//! (eagle3.md §2–3), computed from stored final hidden states and the target lm_head, or from
//! stored top-k log-probabilities.
//!
//! The full-vocabulary pass (log-partition and argmax over V) runs in row chunks of the head with
//! an online log-sum-exp, so a 163840-row head never materialises `[L, V]` float32 logits.
//!
//! [`batch`] turns shard samples into a device batch with its teacher ([`collate`]), caching the
//! full-vocabulary statistics per sample for training ([`VocabStatsCache`]).

use burn::tensor::{Int, Tensor, TensorData, activation::softmax, backend::Backend};

use crate::kernels::mm;
use crate::precision::upcast;
use aerie_data::vocab::DraftVocab;

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

/// What the teacher takes from the whole target vocabulary at each position of a batch (row-major
/// over `[B, L]`): the log-partition (kept in f64, which holds f32 and f64 values exactly) and
/// the argmax. See [`TargetHead::targets_with`].
#[derive(Debug, Clone, PartialEq)]
pub struct VocabStats {
    /// log Σ_v exp(logit_v).
    pub log_z: Vec<f64>,
    /// First index of the largest logit.
    pub argmax: Vec<i64>,
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
    pub fn new(weight: Tensor<B, 2>, vocab: &DraftVocab, chunk_rows: usize) -> Self {
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
        self.targets_from(x, log_z, argmax, [b, l])
    }

    /// The full-vocabulary statistics of final hidden states `[N, Ht]` (one sequence, unpadded):
    /// the pass over all V rows of the head, which is most of the teacher's cost (SmolLM2: 57 of
    /// the 61 MFLOP per token, half as much again as the drafter's own forward and backward). It
    /// depends only on the captured states, so training computes it once per sample and reuses
    /// it in later epochs ([`Self::targets_with`]). Computed per sequence, not per batch, so that
    /// the bits do not depend on which batch the sample first came in (the matmul's kernels
    /// depend on the number of rows).
    pub fn vocab_stats(&self, final_hidden: Tensor<B, 2>) -> VocabStats {
        let (log_z, argmax) = self.full_vocab_stats(final_hidden);
        VocabStats {
            log_z: log_z.into_data().convert::<f64>().into_vec::<f64>().expect("f64 log_z"),
            argmax: argmax.into_data().convert::<i64>().into_vec::<i64>().expect("i64 argmax"),
        }
    }

    /// [`Self::targets`] with the full-vocabulary statistics of the batch's positions given
    /// (`[B, L]` row-major; padding positions may hold anything finite, the loss masks them).
    pub fn targets_with(&self, final_hidden: Tensor<B, 3>, stats: &VocabStats) -> TeacherTargets<B> {
        let [b, l, ht] = final_hidden.dims();
        assert_eq!(
            stats.log_z.len(),
            b * l,
            "vocabulary statistics for {} positions, the batch has {}",
            stats.log_z.len(),
            b * l
        );
        let x = final_hidden.reshape([b * l, ht]);
        let device = x.device();
        let log_z = Tensor::<B, 2>::from_data(TensorData::new(stats.log_z.clone(), [b * l, 1]), &device)
            .cast(upcast(x.clone()).dtype());
        let argmax = Tensor::<B, 1, Int>::from_data(TensorData::new(stats.argmax.clone(), [b * l]), &device);
        self.targets_from(x, log_z, argmax, [b, l])
    }

    fn targets_from(
        &self,
        x: Tensor<B, 2>,
        log_z: Tensor<B, 2>,
        argmax: Tensor<B, 1, Int>,
        [b, l]: [usize; 2],
    ) -> TeacherTargets<B> {
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
    vocab: &DraftVocab,
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::Distribution;

    fn bits<const D: usize>(t: &Tensor<Flex, D>) -> Vec<u32> {
        t.clone().into_data().into_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// Statistics computed for a sequence alone, placed into a padded batch with another sequence,
    /// give the same teacher bits at that sequence's positions as computing everything for the
    /// batch: what lets training cache them per sample. The head is split into uneven chunks.
    #[test]
    fn cached_vocab_stats_give_the_same_teacher() {
        let dev = Default::default();
        let (v, ht) = (300, 24);
        let weight = Tensor::<Flex, 2>::random([v, ht], Distribution::Normal(0.0, 1.0), &dev);
        let vocab = DraftVocab::from_target_ids((0..v).step_by(3).collect(), v).unwrap();
        let head = TargetHead::new(weight, &vocab, 128);
        let a = Tensor::<Flex, 2>::random([12, ht], Distribution::Normal(0.0, 3.0), &dev);
        let s = Tensor::<Flex, 2>::random([10, ht], Distribution::Normal(0.0, 3.0), &dev);
        let s_values = s.clone().into_data().into_vec::<f32>().unwrap();
        let (sa, ss) = (head.vocab_stats(a.clone()), head.vocab_stats(s.clone()));
        let mut stats = VocabStats { log_z: vec![0.0; 24], argmax: vec![0; 24] };
        stats.log_z[..12].copy_from_slice(&sa.log_z);
        stats.argmax[..12].copy_from_slice(&sa.argmax);
        stats.log_z[12..22].copy_from_slice(&ss.log_z);
        stats.argmax[12..22].copy_from_slice(&ss.argmax);
        let padded = Tensor::cat(vec![s, Tensor::zeros([2, ht], &dev)], 0);
        let batch = Tensor::stack::<3>(vec![a, padded], 0);
        let direct = head.targets(batch.clone());
        let cached = head.targets_with(batch, &stats);
        let rows = |t: &Tensor<Flex, 3>| -> Vec<u32> {
            let vd = t.dims()[2];
            bits(&t.clone().reshape([24, vd]).slice([0..22, 0..vd]))
        };
        let close = |x: Vec<u32>, y: Vec<u32>, what: &str| {
            for (i, (p, q)) in x.iter().zip(&y).enumerate() {
                let (p, q) = (f32::from_bits(*p), f32::from_bits(*q));
                assert!((p - q).abs() <= 1e-6 * (1.0 + q.abs()), "{what}[{i}]: {p} vs {q}");
            }
        };
        // p does not use the statistics: the same bits; pf and in_draft use them: per-sequence
        // against per-batch matmuls round differently only in the last bits.
        assert_eq!(rows(&direct.p), rows(&cached.p));
        close(rows(&direct.pf), rows(&cached.pf), "pf");
        assert_eq!(
            bits(&direct.in_draft.clone().reshape([24]).narrow(0, 0, 22)),
            bits(&cached.in_draft.clone().reshape([24]).narrow(0, 0, 22))
        );
        let of_s = ss;
        // And they are the log-partition and argmax of a plain f64 computation (1e-5: f32 logits
        // over Ht = 24 products; the argmax may differ only on a near-tie).
        let w = head.weight.clone().into_data().into_vec::<f32>().unwrap();
        let xs: Vec<&[f32]> = s_values.chunks(ht).collect();
        for (row, x) in xs.iter().enumerate() {
            let logits: Vec<f64> = (0..v).map(|t| (0..ht).map(|k| x[k] as f64 * w[t * ht + k] as f64).sum()).collect();
            let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let log_z = max + logits.iter().map(|z| (z - max).exp()).sum::<f64>().ln();
            assert!((of_s.log_z[row] - log_z).abs() < 1e-5 * (1.0 + log_z.abs()), "{} vs {log_z}", of_s.log_z[row]);
            let arg = logits.iter().position(|&z| z == max).unwrap();
            let got = of_s.argmax[row] as usize;
            assert!(got == arg || (logits[got] - max).abs() < 1e-4, "argmax {got} vs {arg}");
        }
    }
}

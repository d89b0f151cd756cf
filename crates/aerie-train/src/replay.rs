//! On-policy replay of the positions decoding drafts from (`optim.replay_weight`), after
//! Draft-OPD (arXiv 2605.29343). The soft-CE trains the drafter at every position of the answers,
//! but a greedy chain decoder drafts only where its verify cycles start (right after each bonus
//! token), and the errors that limit acceptance are exposed there. This module finds those
//! positions for the CURRENT drafter inside each training step, from the hits of the forward the
//! step runs anyway ([`aerie_model::ttt::StepStats::hit_tok`]), so the replay is on-policy at no
//! extra forward; the objective ([`crate::objective::micro_loss`]) then adds
//! β · Σ_k w_k · Σ_t r_k[t] · ce_tok_k[t] / positions.
//!
//! Why the walk visits decoding's positions. The TTT step k at position t drafts token t + k + 2
//! from the target's features at t and the answer's tokens t + 1 ..= t + k + 1 as the draft
//! inputs. Decoding's cycle after emitted token t + 1 drafts from the same features with its own
//! drafts as inputs; under the greedy rule a draft is accepted exactly when it is the target's
//! argmax, which is the answer's next token when the answers are the target's own greedy output.
//! So as long as the earlier drafts of a cycle were accepted, the step-k draft decoding makes is
//! the one the TTT step makes, and a cycle starting at t accepts a = the leading run of steps
//! with `hit_k[t] > 0`, reaches steps 0 ..= min(a, K − 1) (the accepted drafts and the first
//! rejected one; all K after a full accept) and is followed by the cycle at t + a + 1 (after the
//! bonus), as `aerie eval accept`'s walk does (aerie-eval `cycles.rs`, docs/decoding.md "The
//! offline prediction walks the cycles"; aerie-train may not depend on aerie-eval, so the walk is
//! its own here).
//!
//! Where it is not exact. The EAGLE-3 mask scores position t on answer token t, so decoding's
//! first cycle of an answer, drafted from the last prompt position, is not scored (pm = 0 there):
//! each answer's walk starts at its first scored position, as if that first cycle had rejected
//! its first draft. When it would have accepted some, decoding's starts are shifted from the
//! walk's until both land on the same position, after which they coincide (the next start
//! depends on the position alone). Positions whose token is outside the draft vocabulary (pm = 0
//! inside an answer) end a span; the walk resumes at the next scored position, which is where
//! decoding resumes after such a token's certain rejection. With answers not generated greedily
//! by the target, a hit is the target's argmax and no longer the answer token, and the walk is
//! an approximation of decoding's.

use aerie_model::precision::host_f32;
use aerie_model::ttt::TttOutput;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::objective::BatchMasks;

/// The replay weights of one micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// `[B, L]`.
    pub shape: [usize; 2],
    /// r_k per unrolled step k, each `[B·L]`: 1 where the cycle starting at t reached step k.
    pub weights: Vec<Vec<f32>>,
    /// Cycle starts walked.
    pub starts: f64,
    /// Positions with pm > 0 (where a cycle could start).
    pub pm_positions: f64,
}

/// Walk the cycles of one sequence. `pm` is its row of [`BatchMasks::pm`]; `accepted(t)` is the
/// number of leading steps k = 0.. with a hit at t (the caller bounds it by K); `visit(t, a)` is
/// called for every cycle start t with its accepted count.
pub fn walk_row(pm: &[f32], accepted: impl Fn(usize) -> usize, mut visit: impl FnMut(usize, usize)) {
    let mut t = 0;
    while t < pm.len() {
        if pm[t] <= 0.0 {
            // Outside a span: on to the next span's first position.
            t += 1;
            continue;
        }
        let a = accepted(t);
        visit(t, a);
        t += a + 1;
    }
}

impl Replay {
    /// The replay weights from per-step hits `hits[k]` `[B·L]` (> 0: the step-k draft at t is the
    /// target's argmax; zero wherever pm_k is, as `hit_tok` is) and the micro-batch's pm.
    pub fn from_hits(hits: &[Vec<f32>], pm: &[f32], shape: [usize; 2]) -> Self {
        let [b, l] = shape;
        let k_len = hits.len();
        let mut weights = vec![vec![0f32; b * l]; k_len];
        let mut starts = 0usize;
        for r in 0..b {
            let row = r * l;
            let accepted = |t: usize| (0..k_len).take_while(|&k| hits[k][row + t] > 0.0).count();
            walk_row(&pm[row..row + l], accepted, |t, a| {
                starts += 1;
                // The accepted drafts and the first rejected one; all K after a full accept.
                for w in weights.iter_mut().take((a + 1).min(k_len)) {
                    w[row + t] = 1.0;
                }
            });
        }
        let pm_positions = pm.iter().filter(|&&v| v > 0.0).count() as f64;
        Self { shape, weights, starts: starts as f64, pm_positions }
    }

    /// The replay weights of a forward's own hits (read to the host: `[B, L]` per step).
    pub fn of<B: Backend>(out: &TttOutput<B>, masks: &BatchMasks) -> Self {
        let hits: Vec<Vec<f32>> = out.steps.iter().map(|s| host_f32(s.hit_tok.clone())).collect();
        Self::from_hits(&hits, &masks.pm, masks.shape)
    }

    /// β · Σ_k w_k · Σ_t r_k[t] · ce_tok_k[t] / `positions` (differentiable through `ce_tok`; r is
    /// a constant): the term the objective adds to the soft-CE, `None` when no step reached any
    /// position. `positions` is the whole step's
    /// normaliser, as the soft-CE's, so splitting a step changes nothing but rounding.
    pub fn term<B: Backend>(
        &self,
        out: &TttOutput<B>,
        step_weights: &[f64],
        positions: f64,
        beta: f64,
    ) -> Option<Tensor<B, 1>> {
        let [b, l] = self.shape;
        let mut total: Option<Tensor<B, 1>> = None;
        for ((s, r), &w) in out.steps.iter().zip(&self.weights).zip(step_weights) {
            if r.iter().all(|&v| v == 0.0) {
                continue;
            }
            let ce = s.ce_tok.clone();
            let r = Tensor::<B, 2>::from_data(TensorData::new(r.clone(), [b, l]), (&ce.device(), ce.dtype()));
            let term = (ce * r).sum().mul_scalar(w / positions.max(1.0));
            total = Some(match total {
                Some(t) => t + term,
                None => term,
            });
        }
        total.map(|t| t.mul_scalar(beta))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LossKind;
    use crate::objective::{Normalisers, micro_loss};
    use aerie_model::checkpoint::{Dtype, synthetic};
    use aerie_model::rng::SplitMix;
    use aerie_model::{Drafter, TeacherTargets, TttBatch, TttOptions, ttt_forward};
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{DType, Int};

    type AD = Autodiff<Flex>;

    /// hits[k][t] from the (k, t) pairs that hit, for one row of length `l`.
    fn hits_at(k_len: usize, l: usize, at: &[(usize, usize)]) -> Vec<Vec<f32>> {
        let mut h = vec![vec![0f32; l]; k_len];
        for &(k, t) in at {
            h[k][t] = 1.0;
        }
        h
    }

    /// The positions t with r_k[t] = 1, per step.
    fn reached(r: &Replay) -> Vec<Vec<usize>> {
        r.weights.iter().map(|w| (0..w.len()).filter(|&t| w[t] > 0.0).collect()).collect()
    }

    #[test]
    fn the_walk_follows_the_cycles_across_spans() {
        // K = 3, spans [1, 7) and [9, 11).
        let pm = [0., 1., 1., 1., 1., 1., 1., 0., 0., 1., 1., 0.].map(|v: f64| v as f32);
        let hits = hits_at(
            3,
            12,
            &[
                // t = 1: a full accept, all K steps reached, next start 1 + 3 + 1 = 5.
                (0, 1),
                (1, 1),
                (2, 1),
                // Hits at positions no cycle starts at change nothing.
                (0, 2),
                (0, 3),
                (1, 4),
                // t = 5: rejected at step 0, next start 6. t = 6: one accepted (its step 1
                // would score position 7, pm 0), next start 8 is outside a span: on to 9.
                (1, 5),
                (0, 6),
                // t = 9: two accepted (step 2 would score position 11, pm 0), next start 12: done.
                (0, 9),
                (1, 9),
            ],
        );
        let r = Replay::from_hits(&hits, &pm, [1, 12]);
        assert_eq!(reached(&r), vec![vec![1, 5, 6, 9], vec![1, 6, 9], vec![1, 9]]);
        assert_eq!((r.starts, r.pm_positions), (4.0, 8.0));
    }

    #[test]
    fn no_hit_starts_a_cycle_at_every_position_and_rows_walk_alone() {
        // Row 0: no hit, so every scored position is a start (a rejection at step 0 moves one
        // position on). Row 1: one span [0, 8) of full accepts jumping K + 1 = 3 each time.
        let (k_len, l) = (2, 8);
        let pm: Vec<f32> = [0f32, 0., 1., 1., 1., 0., 1., 0.].iter().chain(&[1f32; 8]).copied().collect();
        let mut hits = vec![vec![0f32; 2 * l]; k_len];
        // Step 0 hits everywhere in row 1; step 1 everywhere its position t + 1 is in the row.
        for t in 0..l {
            hits[0][l + t] = 1.0;
            if t + 1 < l {
                hits[1][l + t] = 1.0;
            }
        }
        let r = Replay::from_hits(&hits, &pm, [2, l]);
        // Row 1: starts 0, 3, 6, each a full accept; the next start, 9, is past the row.
        assert_eq!(reached(&r), vec![vec![2, 3, 4, 6, 8, 11, 14], vec![8, 11, 14]]);
        assert_eq!((r.starts, r.pm_positions), (7.0, 12.0));
    }

    #[test]
    fn the_end_of_a_span_ends_its_last_cycle() {
        // K = 4, one span [0, 3): the cycle at 0 accepts 3 (all the span holds: hit_tok is zero
        // past it), reaches steps 0..=3, and the walk ends.
        let pm = [1f32, 1., 1., 0., 0.];
        let hits = hits_at(4, 5, &[(0, 0), (1, 0), (2, 0)]);
        let r = Replay::from_hits(&hits, &pm, [1, 5]);
        assert_eq!(reached(&r), vec![vec![0], vec![0], vec![0], vec![0]]);
        assert_eq!((r.starts, r.pm_positions), (1.0, 3.0));
        // An empty row starts nothing.
        let r = Replay::from_hits(&hits_at(2, 3, &[]), &[0.0; 3], [1, 3]);
        assert_eq!((r.starts, r.pm_positions, reached(&r)), (0.0, 0.0, vec![vec![], vec![]]));
    }

    /// The replay weights computed span by span, written independently of [`walk_row`].
    fn host_weights(hits: &[Vec<f32>], pm: &[f32], [b, l]: [usize; 2]) -> Vec<Vec<f64>> {
        let k_len = hits.len();
        let mut r = vec![vec![0f64; b * l]; k_len];
        for row in 0..b {
            let on: Vec<bool> = (0..l).map(|t| pm[row * l + t] > 0.0).collect();
            let mut s = 0;
            while s < l {
                if !on[s] {
                    s += 1;
                    continue;
                }
                let e = (s..l).find(|&t| !on[t]).unwrap_or(l);
                let mut t = s;
                while t < e {
                    let mut a = 0;
                    while a < k_len && hits[a][row * l + t] > 0.0 {
                        a += 1;
                    }
                    for rk in r.iter_mut().take(a.min(k_len - 1) + 1) {
                        rk[row * l + t] = 1.0;
                    }
                    t += a + 1;
                }
                s = e;
            }
        }
        r
    }

    /// A tiny random drafter (f64) and a padded batch of two sequences with a random teacher.
    fn drafter_and_batch() -> (Drafter<AD>, TttBatch<AD>) {
        let cfg = synthetic::tiny_config();
        let ckpt = synthetic::random_drafter(&cfg, Dtype::F32, 5);
        let dev = Default::default();
        let d = Drafter::<AD>::from_tensors_as(&cfg, &ckpt.tensors, &dev, DType::F64).unwrap();
        let (b, l, vd, aw) = (2, 14, cfg.draft_vocab_size, cfg.num_aux() * cfg.target_hidden_size);
        let lens = [14, 10];
        let mut rng = SplitMix(9);
        let ids: Vec<i64> = (0..b * l).map(|_| (rng.next_u64() % cfg.vocab_size as u64) as i64).collect();
        let valid: Vec<f64> = (0..b * l).map(|i| f64::from(i % l < lens[i / l])).collect();
        // Two answer turns in row 0, one in row 1; a token outside the draft vocab in row 0.
        let mask: Vec<f64> = (0..b * l).map(|i| f64::from(matches!(i % l, 2..=6 | 9..=13) || i >= l + 3)).collect();
        let in_draft: Vec<f64> = (0..b * l).map(|i| f64::from(i != 5)).collect();
        let aux: Vec<f64> = (0..b * l * aw).map(|_| rng.signed_unit() as f64).collect();
        let p: Vec<f64> = (0..b * l)
            .flat_map(|_| {
                let z: Vec<f64> = (0..vd).map(|_| 3.0 * rng.signed_unit() as f64).collect();
                let s: f64 = z.iter().map(|v| v.exp()).sum();
                z.into_iter().map(move |v| v.exp() / s)
            })
            .collect();
        let f2 = |v: Vec<f64>| Tensor::<AD, 2>::from_data(TensorData::new(v, [b, l]), (&dev, DType::F64));
        let f3 = |v: Vec<f64>, c: usize| Tensor::<AD, 3>::from_data(TensorData::new(v, [b, l, c]), (&dev, DType::F64));
        let batch = TttBatch {
            input_ids: Tensor::<AD, 2, Int>::from_data(TensorData::new(ids, [b, l]), &dev),
            loss_mask: f2(mask),
            valid: f2(valid),
            aux: f3(aux, aw),
            teacher: TeacherTargets {
                pf: f3(p.iter().map(|v| 0.9 * v).collect(), vd),
                p: f3(p, vd),
                in_draft: f2(in_draft),
            },
        };
        (d, batch)
    }

    #[test]
    fn the_replay_term_is_the_host_sum_of_the_walked_cross_entropies() {
        let _alone = aerie_model::autodiff::exclusive();
        let (drafter, batch) = drafter_and_batch();
        let opts = TttOptions::geometric(3, 0.8).with_alpha_grad(false);
        let out = ttt_forward(&drafter, &batch, &opts).unwrap();
        let masks = BatchMasks::of(&batch);
        // Half the positions of a step, as if the step had another micro-batch as large.
        let norm = Normalisers { positions: 2.0 * masks.positions, ..Normalisers::of(&[&masks], 3) };
        let w = &opts.step_weights;
        let value = |t: Tensor<AD, 1>| t.into_data().convert::<f64>().into_vec::<f64>().unwrap()[0];
        let ce: Vec<Vec<f64>> =
            out.steps.iter().map(|s| s.ce_tok.clone().into_data().convert::<f64>().into_vec().unwrap()).collect();
        let host_term = |r: &[Vec<f64>]| -> f64 {
            let per_step = r.iter().zip(&ce).map(|(r, c)| r.iter().zip(c).map(|(r, c)| r * c).sum::<f64>());
            per_step.zip(w).map(|(s, w)| w * s).sum::<f64>() / norm.positions
        };
        let base = value(micro_loss(LossKind::SoftCe, &out, &batch, &masks, &norm, w, None));
        let beta = 0.7;
        // The forward's own hits, and hits drawn at random (more cycles that accept) where pm_k > 0.
        let own: Vec<Vec<f32>> = out.steps.iter().map(|s| host_f32(s.hit_tok.clone())).collect();
        let mut rng = SplitMix(4);
        let [b, l] = masks.shape;
        let drawn: Vec<Vec<f32>> = (0..3)
            .map(|k| {
                (0..b * l)
                    .map(|i| {
                        let pm_k = if i % l + k < l { masks.pm[i + k] } else { 0.0 };
                        if pm_k > 0.0 && rng.next_u64() % 10 < 7 { 1.0 } else { 0.0 }
                    })
                    .collect()
            })
            .collect();
        assert_eq!(Replay::of(&out, &masks), Replay::from_hits(&own, &masks.pm, masks.shape));
        for hits in [own, drawn] {
            let replay = Replay::from_hits(&hits, &masks.pm, masks.shape);
            let want = host_weights(&hits, &masks.pm, masks.shape);
            let got: Vec<Vec<f64>> = replay.weights.iter().map(|r| r.iter().map(|&v| v as f64).collect()).collect();
            assert_eq!(got, want);
            assert!(replay.starts > 0.0 && replay.starts <= replay.pm_positions);
            let with = value(micro_loss(
                LossKind::SoftCe,
                &out,
                &batch,
                &masks,
                &norm,
                w,
                replay.term(&out, w, norm.positions, beta),
            ));
            let host = beta * host_term(&want);
            assert!(host > 0.0);
            assert!(((with - base) - host).abs() <= 1e-12 * host.max(base), "{} vs {host}", with - base);
        }
    }
}

//! The verifier of `aerie eval accept`: the drafter proposes in serving mode at every assistant
//! position of captured shards ([`aerie_model::drafter::offline`]), and each draft is checked against the
//! target's distribution at the position it proposes, under one of the rules of
//! [`AcceptRule`]. The statistics are the pure functions of [`crate::accept`].
//!
//! Positions. Position t stands for the verify pass right after the target emitted x_{t+1}; its
//! step-k draft proposes x_{t+2+k} and is checked against the teacher of row t+1+k (the target's
//! distribution of x_{t+2+k} given the CAPTURED prefix). Position t counts when x_{t+1} and x_{t+2}
//! are both assistant tokens (loss mask 1): the target generated the token the cycle starts from,
//! and the first draft proposes a token the target will generate. A draft whose token is past the
//! end of the assistant turn (mask 0) or of the sequence cannot be verified: the chain is cut
//! there, as generation stops at the end of a turn, and the rest counts as rejected.
//!
//! The teacher is valid for drafts beyond the first only when the accepted drafts reproduce the
//! captured continuation, i.e. when the captured tokens are the target's own greedy outputs. The
//! share of positions where they are not is measured and reported with a warning.
//!
//! Assistant tokens are the answer tokens of [`crate::cycles::answer_tokens`]: the end-of-turn
//! token a template adds after an answer cut at its token budget is not one. Under the greedy
//! rule, τ and the curve come from the cycles decoding runs ([`crate::cycles`]: a draft starts
//! only where the last cycle ended); the per-position rates and histogram stay the average over
//! every position, and `tau_all_positions` is their τ.

use aerie_data::shard::{SampleView, ShardDataset};
use aerie_model::drafter::offline::{ChainOptions, DraftSampling, draft_chain, draft_tree};
use aerie_model::drafter::shape::DraftShape;
use aerie_model::{Drafter, TargetHead};
use burn::tensor::{DType, Int, Tensor, TensorData, backend::Backend};

use crate::accept::{AcceptCounter, AcceptReport, AcceptRule, tree_accept};
use crate::cycles::{CycleCount, answer_tokens, spans};
use crate::{Error, Result};
use aerie_data::shard::batch::length_sorted_batches;
use aerie_model::ttt::batch::{TeacherSource, check_compatible, collate_finite};

/// What `eval accept` drafts and how it verifies.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptOptions {
    /// The draft layout: a chain of K, or a tree of depth K.
    pub shape: DraftShape,
    /// Draft temperature; 0 drafts the argmax.
    pub temperature: f64,
    /// Seed of the draft sampler.
    pub seed: u64,
    /// Verify rule.
    pub rule: AcceptRule,
    /// Samples per forward.
    pub batch_size: usize,
    /// Evaluate only the first N samples.
    pub max_samples: Option<usize>,
    /// Rows of the target head per chunk of the full-vocabulary argmax.
    pub head_chunk_rows: usize,
    /// The token budget the captured answers were generated with (`--max-new-tokens`): an
    /// answer is at most that long, so the end-of-turn token after a cut answer is known not to
    /// be the target's. Without it, that token is recognised by the target's argmax.
    pub answer_budget: Option<usize>,
}

impl Default for AcceptOptions {
    fn default() -> Self {
        Self {
            shape: DraftShape::Chain { k: 3 },
            temperature: 0.0,
            seed: 0,
            rule: AcceptRule::Greedy,
            batch_size: 4,
            max_samples: None,
            head_chunk_rows: 8192,
            answer_budget: None,
        }
    }
}

impl AcceptOptions {
    /// Reject combinations that have no meaning.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Incompatible(m));
        // The layout's own rule; topk against the draft vocabulary is checked when drafting.
        if let Err(m) = self.shape.check(usize::MAX) {
            return bad(m);
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if self.rule == AcceptRule::Sampling && self.temperature == 0.0 {
            return bad("--rule sampling verifies drafts sampled from q: give --temperature > 0 (argmax drafts under sampling verification are --rule onehot)".into());
        }
        if self.answer_budget == Some(0) {
            return bad("the answers' token budget must be at least 1".into());
        }
        if self.shape.tree().is_some() && self.rule != AcceptRule::Greedy {
            return bad(format!("tree drafts are verified greedily only (got --rule {})", self.rule.name()));
        }
        Ok(())
    }
}

/// Full-vocabulary argmax `[N]` of `x [N, Ht]` against `weight [V, Ht]`, in row chunks (first
/// index on ties), so that `[N, V]` logits never exist at once.
pub fn full_vocab_argmax<B: Backend>(weight: &Tensor<B, 2>, x: Tensor<B, 2>, chunk_rows: usize) -> Vec<u32> {
    let [n, _] = x.dims();
    let v = weight.dims()[0];
    let x = x.cast(DType::F32);
    let mut best: Option<(Tensor<B, 2>, Tensor<B, 2, Int>)> = None;
    let mut start = 0;
    while start < v {
        let rows = chunk_rows.max(1).min(v - start);
        let logits = x.clone().matmul(weight.clone().narrow(0, start, rows).cast(DType::F32).transpose());
        let (m, a) = logits.max_dim_with_indices(1);
        let a = a.add_scalar(start as i64);
        best = Some(match best {
            None => (m, a),
            Some((bm, ba)) => {
                let better = m.clone().greater(bm.clone());
                (bm.max_pair(m), ba.mask_where(better, a))
            }
        });
        start += rows;
    }
    match best {
        Some((_, a)) => a.reshape([n]).into_data().iter::<i64>().map(|i| i as u32).collect(),
        None => vec![0; n],
    }
}

/// The target's argmax per token of each sample, `[B·L]` row-major (0 on padding).
fn teacher_argmax<B: Backend>(
    samples: &[SampleView<'_>],
    l: usize,
    head: Option<&Tensor<B, 2>>,
    chunk_rows: usize,
    device: &B::Device,
) -> Result<Vec<u32>> {
    let b = samples.len();
    match head {
        Some(w) => {
            let ht = w.dims()[1];
            let mut fin = vec![0f32; b * l * ht];
            for (i, s) in samples.iter().enumerate() {
                let f = s.final_hidden().ok_or_else(|| {
                    Error::Incompatible(format!("{}: no `final_hidden` teacher in the shard", s.shard_path().display()))
                })?;
                if f.width() != ht {
                    return Err(Error::Incompatible(format!(
                        "{}: final hidden width {} differs from the target head's {ht}",
                        s.shard_path().display(),
                        f.width()
                    )));
                }
                f.decode_into(&mut fin[i * l * ht..(i * l + s.len()) * ht])?;
            }
            let x = Tensor::<B, 2>::from_data(TensorData::new(fin, [b * l, ht]), device);
            Ok(full_vocab_argmax(w, x, chunk_rows))
        }
        None => {
            let mut out = vec![0u32; b * l];
            for (i, s) in samples.iter().enumerate() {
                let t = s.topk().ok_or_else(|| {
                    Error::Incompatible(format!("{}: no top-k teacher in the shard", s.shard_path().display()))
                })?;
                let (k, ids, lps) = (t.k(), t.ids(), t.logprobs());
                for row in 0..s.len() {
                    let r = &lps[row * k..(row + 1) * k];
                    let best = (0..k).fold(0, |a, j| if r[j] > r[a] { j } else { a });
                    out[i * l + row] = ids[row * k + best] as u32;
                }
            }
            Ok(out)
        }
    }
}

fn host_rows<B: Backend>(t: Tensor<B, 2>, b: usize, rows: usize, l: usize) -> Vec<f64> {
    let v: Vec<f64> = t.into_data().iter::<f64>().collect();
    let mut out = vec![0.0; b * l];
    for i in 0..b {
        out[i * l..i * l + rows].copy_from_slice(&v[i * rows..(i + 1) * rows]);
    }
    out
}

/// Evaluate acceptance of `drafter` on `data`. With `head` (the target lm_head `[V, Ht]`) the
/// teacher comes from the stored final hidden states, otherwise from the stored top-k
/// log-probabilities. `progress(done, total)` is called after every batch (samples).
pub fn eval_accept<B: Backend>(
    drafter: &Drafter<B>,
    data: &ShardDataset,
    head: Option<&Tensor<B, 2>>,
    opts: &AcceptOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<AcceptReport> {
    opts.validate()?;
    let cfg = drafter.config();
    check_compatible(cfg, data.metadata())?;
    let target_head = head.map(|w| TargetHead::new(w.clone(), drafter.vocab(), opts.head_chunk_rows));
    let teacher = match &target_head {
        Some(h) => TeacherSource::Head(h),
        None => TeacherSource::TopK,
    };
    let n = opts.max_samples.map_or(data.len(), |m| m.min(data.len()));
    let samples: Vec<_> = data.iter().take(n).collect();
    let lengths: Vec<usize> = samples.iter().map(|s| s.len()).collect();
    let device = drafter.embed_tokens.device();
    let k = opts.shape.depth();
    let mut counter = AcceptCounter::new(k);
    // The cycle walk of each chain prefix k' = 1..=K (one walk of depth K for a tree).
    let depths: Vec<usize> = if opts.shape.tree().is_some() { vec![k] } else { (1..=k).collect() };
    let mut walks: Vec<CycleCount> = depths.iter().map(|&k| CycleCount { k, ..CycleCount::default() }).collect();
    let mut done = 0;
    for idx in length_sorted_batches(&lengths, opts.batch_size) {
        let chunk: Vec<_> = idx.iter().map(|&i| samples[i]).collect();
        let batch = collate_finite::<B>(&chunk, cfg, drafter.vocab(), &teacher, &device)?;
        let [b, l] = batch.input_ids.dims();
        let argmax = teacher_argmax(&chunk, l, head, opts.head_chunk_rows, &device)?;
        let ids: Vec<Vec<i32>> = chunk.iter().map(|s| s.input_ids().to_vec()).collect();
        let answer: Vec<Vec<bool>> = (0..b)
            .map(|i| answer_tokens(&ids[i], chunk[i].loss_mask(), &argmax[i * l..(i + 1) * l], opts.answer_budget))
            .collect();
        // Can the draft of step j at position t (proposing x_{t+2+j}) of row i be verified?
        let verifiable = |i: usize, t: usize, j: usize| t + 2 + j < ids[i].len() && answer[i][t + 2 + j];
        let counted = |i: usize, t: usize| t + 2 < ids[i].len() && answer[i][t + 1] && answer[i][t + 2];
        let add_mismatch = |counter: &mut AcceptCounter, i: usize, t: usize| {
            if ids[i][t + 2] as u32 != argmax[i * l + t + 1] {
                counter.captured_not_argmax += 1;
            }
        };
        // Greedy drafts accepted at each counted position `[B·L]`, for the cycle walk.
        let mut accepted = vec![0usize; b * l];

        if let Some(shape) = opts.shape.tree() {
            let tree = draft_tree(drafter, &batch.input_ids, &batch.aux, &shape)?;
            for i in 0..b {
                for t in 0..ids[i].len() {
                    if !counted(i, t) {
                        continue;
                    }
                    add_mismatch(&mut counter, i, t);
                    let target: Vec<Option<u32>> =
                        (0..k).map(|j| verifiable(i, t, j).then(|| argmax[i * l + t + 1 + j])).collect();
                    if target.iter().any(Option::is_none) {
                        counter.cut_by_end += 1;
                    }
                    let nodes = &tree.nodes[i * l + t];
                    let parents: Vec<Option<usize>> = nodes.iter().map(|n| n.parent).collect();
                    let tokens: Vec<u32> = nodes.iter().map(|n| n.target_id).collect();
                    accepted[i * l + t] = tree_accept(&parents, &tokens, &target);
                    counter.add_length(accepted[i * l + t]);
                }
            }
        } else {
            let sampling = if opts.temperature > 0.0 {
                DraftSampling::Sample { temperature: opts.temperature, seed: opts.seed }
            } else {
                DraftSampling::Greedy
            };
            let chain_opts = ChainOptions { steps: k, sampling, keep_q: opts.rule == AcceptRule::Sampling };
            let chain = draft_chain(drafter, &batch.input_ids, &batch.aux, &chain_opts)?;
            // Per step, the acceptance probability of every position's draft, `[B·L]`.
            let probs: Vec<Vec<f64>> = (0..k)
                .map(|j| {
                    let rows = l.saturating_sub(1 + j);
                    if rows == 0 {
                        return vec![0.0; b * l];
                    }
                    match opts.rule {
                        AcceptRule::Greedy => (0..b * l)
                            .map(|p| {
                                let (i, t) = (p / l, p % l);
                                let row = t + 1 + j;
                                (row < l && chain.target_ids[j][p] == argmax[i * l + row]) as u8 as f64
                            })
                            .collect(),
                        AcceptRule::Onehot => {
                            let d: Vec<i64> = chain.draft_ids[j].iter().map(|&x| x as i64).collect();
                            let d = Tensor::<B, 2, Int>::from_data(TensorData::new(d, [b, l]), &device);
                            let pf = batch.teacher.pf.clone().narrow(1, 1 + j, rows);
                            let got = pf.gather(2, d.narrow(1, 0, rows).unsqueeze_dim::<3>(2));
                            host_rows(got.reshape([b, rows]), b, rows, l)
                        }
                        AcceptRule::Sampling => {
                            let pf = batch.teacher.pf.clone().narrow(1, 1 + j, rows);
                            let q = chain.q[j].clone().narrow(1, 0, rows).cast(pf.dtype());
                            host_rows(pf.min_pair(q).sum_dim(2).reshape([b, rows]), b, rows, l)
                        }
                    }
                })
                .collect();
            for i in 0..b {
                for t in 0..ids[i].len() {
                    if !counted(i, t) {
                        continue;
                    }
                    add_mismatch(&mut counter, i, t);
                    let reach = (0..k).take_while(|&j| verifiable(i, t, j)).count();
                    if reach < k {
                        counter.cut_by_end += 1;
                    }
                    let a: Vec<f64> = (0..reach).map(|j| probs[j][i * l + t]).collect();
                    // Greedy: the leading run of accepted drafts (probabilities 0 or 1).
                    accepted[i * l + t] = a.iter().take_while(|&&p| p == 1.0).count();
                    counter.add_probs(&a);
                }
            }
        }
        if opts.rule == AcceptRule::Greedy {
            for (i, row) in answer.iter().enumerate() {
                for (start, end) in spans(row) {
                    // The cycle after answer token c is position c - 1's (none before the first
                    // token of a sample, which no prefill emitted).
                    let at = |c: usize| if c == 0 { 0 } else { accepted[i * l + c - 1] };
                    for w in &mut walks {
                        let k = w.k;
                        w.walk(start, end, |c| at(c).min(k));
                    }
                }
            }
        }
        done += chunk.len();
        progress(done, n);
    }
    let tree = opts.shape.tree().map(|t| (t.topk, t.verify_tokens));
    let mut report = AcceptReport::from_counter(&counter, opts.rule, tree, opts.temperature);
    if opts.rule == AcceptRule::Greedy {
        report = report.with_cycles(walks);
    }
    report.samples = n;
    if opts.rule == AcceptRule::Sampling && opts.temperature > 0.0 && opts.temperature != 1.0 {
        report.warnings.push(format!(
            "the target's p is taken at temperature 1 while drafts use temperature {}: sampling-rule τ assumes the engine samples the target at temperature 1",
            opts.temperature
        ));
    }
    if opts.rule == AcceptRule::Greedy && opts.temperature > 0.0 {
        report.warnings.push("sampled drafts verified greedily: a mixed setting no engine runs".into());
    }
    Ok(report)
}

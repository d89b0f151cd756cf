//! Real EAGLE-3 speculative decoding on the native target (EAGLE-3, arXiv 2503.01840; trees from
//! EAGLE-2, arXiv 2406.16858; lossless verification from Leviathan et al., arXiv 2211.17192), the
//! way SGLang's EAGLE worker runs a request, batch 1:
//!
//! 1. prefill: the target runs the prompt, keeping its KV cache and the aux features; the first
//!    token comes from its last logits; the drafter extends over the prompt (position t pairs f_t
//!    with x_{t+1});
//! 2. draft: from the last extended position, a chain of k tokens (argmax, or sampled from q), or
//!    an EAGLE-2 tree (top-k children of the best k paths per step, pruned to N−1 nodes by
//!    cumulative log q);
//! 3. verify: one target forward over [last token, drafts] (a tree attends through its ancestor
//!    mask, siblings share a position), then accept:
//!    - greedy (temperature 0): follow the drafts equal to the target argmax, then the argmax;
//!    - onehot (drafts chosen deterministically, as SGLang does): recursive rejection with q one-hot,
//!      child c accepted with probability p(c) of the residual, p(c) zeroed and p renormalised on
//!      rejection, the bonus sampled from the residual;
//!    - sampling (chain drafts sampled from q): accept with min(1, p/q), on rejection sample
//!      from norm(max(0, p − q)).
//!
//!    Both sampling rules leave the output distribution exactly the target's;
//! 4. the target cache keeps the accepted path, the drafter extends over it with the verify
//!    pass's aux features, and the next cycle starts from the bonus token.
//!
//! Every forward is timed: plain decode steps (T_d), verify passes by size (T_v(n)), drafter
//! forwards (extend and steps: T_s), whole cycles; [`DecodeTimings::costs`] turns them into a
//! costs file for `aerie project`.

mod run;

use std::collections::BTreeMap;
use std::time::Instant;

use aerie_model::drafter::decode::{BranchKv, DraftKv, StepOutput, row_index};
use aerie_model::drafter::offline::{SplitMix, sample_index};
use aerie_model::drafter::tree::{TreeNode, prune, top_children};
use aerie_model::{CaptureRequest, LogitsMode, TargetModel};
use aerie_model::{Drafter, TargetCache};
use burn::tensor::{Bool, Int, Tensor, TensorData, backend::Backend};
use serde::Serialize;

use crate::accept::AcceptRule;
use crate::cost::{Costs, Provenance, VerifyCost};
use crate::{Error, Result};

pub use run::{DecodeReport, MeasuredCosts, PromptReport, Throughput, TurnReport, decode_prompts};

/// How drafts are laid out each cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DraftShape {
    /// A chain of `k` drafts (SGLang topk 1, `num_steps` k, k+1 verified tokens).
    Chain {
        /// Drafts per cycle.
        k: usize,
    },
    /// An EAGLE-2 tree: `depth` draft steps, `topk` children per node, `tokens` verified per
    /// pass, root included.
    Tree {
        /// Draft steps.
        depth: usize,
        /// Children per node and paths kept per step.
        topk: usize,
        /// Tokens verified per cycle, root included.
        tokens: usize,
    },
}

impl DraftShape {
    /// Drafter forwards per cycle (one extend plus depth − 1 steps).
    pub fn depth(&self) -> usize {
        match *self {
            DraftShape::Chain { k } => k,
            DraftShape::Tree { depth, .. } => depth,
        }
    }

    /// Tokens the target verifies per cycle, root included.
    pub fn verify_tokens(&self) -> usize {
        match *self {
            DraftShape::Chain { k } => k + 1,
            DraftShape::Tree { tokens, .. } => tokens,
        }
    }
}

/// Options of a decoding run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeOptions {
    /// Draft layout.
    pub shape: DraftShape,
    /// Sampling temperature of the target (0: greedy).
    pub temperature: f64,
    /// Verification rule: greedy at temperature 0; onehot or sampling (chain only) above.
    pub rule: AcceptRule,
    /// New tokens per answer at most.
    pub max_new_tokens: usize,
    /// Seed of every sampler (the same seed gives the same outputs).
    pub seed: u64,
}

impl DecodeOptions {
    /// Reject combinations that have no lossless meaning.
    pub fn validate(&self, draft_vocab: usize) -> Result<()> {
        let bad = |m: String| Err(Error::Incompatible(m));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if self.max_new_tokens == 0 {
            return bad("max new tokens must be at least 1".into());
        }
        match self.shape {
            DraftShape::Chain { k: 0 } => return bad("k must be at least 1".into()),
            DraftShape::Tree { depth, topk, tokens } => {
                if depth == 0 || topk == 0 || topk > draft_vocab || tokens < 2 {
                    return bad(format!(
                        "a draft tree needs depth >= 1, 1 <= topk <= Vd ({draft_vocab}) and >= 2 verified tokens; got depth {depth}, topk {topk}, tokens {tokens}"
                    ));
                }
                if self.rule == AcceptRule::Sampling {
                    return bad(
                        "the sampling rule needs drafts sampled from q: use a chain (topk 1) or --rule onehot".into()
                    );
                }
            }
            DraftShape::Chain { .. } => {}
        }
        match (self.rule, self.temperature == 0.0) {
            (AcceptRule::Greedy, true) | (AcceptRule::Onehot | AcceptRule::Sampling, false) => Ok(()),
            (AcceptRule::Greedy, false) => {
                bad("the greedy rule decodes at temperature 0; use --rule onehot or sampling above it".into())
            }
            (rule, true) => {
                bad(format!("the {} rule samples: give --temperature > 0 (or use --rule greedy)", rule.name()))
            }
        }
    }
}

/// Wall time of one kind of forward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timer {
    /// Calls timed.
    pub calls: u64,
    /// Seconds in total.
    pub seconds: f64,
}

impl Timer {
    fn add(&mut self, since: Instant) {
        self.calls += 1;
        self.seconds += since.elapsed().as_secs_f64();
    }

    fn merge(&mut self, o: &Timer) {
        self.calls += o.calls;
        self.seconds += o.seconds;
    }

    /// Mean milliseconds per call (`None` before any call).
    pub fn mean_ms(&self) -> Option<f64> {
        (self.calls > 0).then(|| 1e3 * self.seconds / self.calls as f64)
    }
}

/// Every timed forward of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DecodeTimings {
    /// Plain decoding: prompt prefills.
    pub plain_prefill: Timer,
    /// Plain decoding: one-token target forwards (T_d).
    pub plain_step: Timer,
    /// Speculative decoding: prompt prefills (target prefill + drafter extend over the prompt).
    pub spec_prefill: Timer,
    /// Drafter extends over accepted positions, one per cycle.
    pub extend: Timer,
    /// Drafter steps (R branches at once for a tree).
    pub draft_step: Timer,
    /// Target verify passes by verified tokens n (T_v(n)).
    pub verify: BTreeMap<usize, Timer>,
    /// Whole cycles: draft, verify, accept, cache updates (the drafter's next extend included).
    pub cycle: Timer,
}

impl DecodeTimings {
    /// Accumulate another run's timings.
    pub fn merge(&mut self, o: &DecodeTimings) {
        self.plain_prefill.merge(&o.plain_prefill);
        self.plain_step.merge(&o.plain_step);
        self.spec_prefill.merge(&o.spec_prefill);
        self.extend.merge(&o.extend);
        self.draft_step.merge(&o.draft_step);
        for (n, t) in &o.verify {
            self.verify.entry(*n).or_default().merge(t);
        }
        self.cycle.merge(&o.cycle);
    }

    /// T_s: mean drafter forward (extends and steps together: a k-draft cycle runs one extend
    /// and k − 1 steps, so k·T_s is its drafting time).
    pub fn t_s_ms(&self) -> Option<f64> {
        let calls = self.extend.calls + self.draft_step.calls;
        (calls > 0).then(|| 1e3 * (self.extend.seconds + self.draft_step.seconds) / calls as f64)
    }

    /// The measured costs as a costs file: T_d, T_s, the T_v(n) table and the per-cycle overhead
    /// (mean cycle − depth·T_s − mean T_v, what the formula does not otherwise see: host-side
    /// acceptance, cache bookkeeping). `None` when plain or speculative decoding did not run.
    pub fn costs(&self, name: &str, shape: &DraftShape, measured_where: &str, when: &str) -> Option<Costs> {
        let t_d = self.plain_step.mean_ms()?;
        let t_s = self.t_s_ms()?;
        let cycle = self.cycle.mean_ms()?;
        let verify_total: Timer = self.verify.values().fold(Timer::default(), |mut a, t| {
            a.merge(t);
            a
        });
        let t_v_mean = verify_total.mean_ms()?;
        let overhead = (cycle - shape.depth() as f64 * t_s - t_v_mean).max(0.0);
        let table = self.verify.iter().filter_map(|(n, t)| Some((n.to_string(), t.mean_ms()?))).collect();
        Some(Costs {
            name: name.to_owned(),
            t_d_ms: t_d,
            t_s_ms: Some(t_s),
            overhead_ms: overhead,
            t_v: Some(VerifyCost { a_ms: None, b_ms: None, table }),
            cycle_ms: BTreeMap::new(),
            provenance: Provenance {
                measured_where: measured_where.to_owned(),
                when: when.to_owned(),
                by: "aerie eval decode".into(),
                measured: vec!["t_d_ms".into(), "t_s_ms".into(), "t_v.table".into(), "overhead_ms".into()],
                assumed: Vec::new(),
                notes: format!(
                    "means over {} plain decode steps, {} drafter forwards, {} verify passes, {} cycles ({}, depth {}); overhead = cycle - depth*t_s - t_v",
                    self.plain_step.calls,
                    self.extend.calls + self.draft_step.calls,
                    verify_total.calls,
                    self.cycle.calls,
                    match shape {
                        DraftShape::Chain { .. } => "chain",
                        DraftShape::Tree { .. } => "tree",
                    },
                    shape.depth()
                ),
            },
        })
    }
}

/// One answer decoded speculatively.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecAnswer {
    /// New tokens (the stop token included when one ended the answer).
    pub tokens: Vec<u32>,
    /// Drafts accepted per cycle (0..=depth); tokens emitted per cycle = this + 1 (fewer only
    /// when the answer ended inside the cycle).
    pub accepted: Vec<usize>,
    /// Tokens emitted per cycle.
    pub emitted: Vec<usize>,
    /// Seconds from the first cycle to the end (prefill excluded).
    pub decode_seconds: f64,
    /// Seconds of prefill (target and drafter).
    pub prefill_seconds: f64,
}

/// One answer decoded plainly.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlainAnswer {
    /// New tokens (the stop token included when one ended the answer).
    pub tokens: Vec<u32>,
    /// Seconds of the one-token steps (prefill excluded).
    pub decode_seconds: f64,
    /// Seconds of prefill.
    pub prefill_seconds: f64,
}

/// The target, its drafter, and what ends an answer.
pub struct SpecDecoder<'a, B: Backend> {
    target: &'a TargetModel<B>,
    drafter: &'a Drafter<B>,
    want: CaptureRequest,
    stop_ids: Vec<u32>,
}

/// A draft: tree nodes (a chain is a path) and, for the sampling rule, q of each node over the
/// target vocabulary as (target id, prob) of the draft vocabulary.
struct Draft {
    nodes: Vec<TreeNode>,
    q: Vec<Vec<(u32, f32)>>,
}

fn host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().iter::<f32>().collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// softmax(row / T) in f64.
fn probs_at(row: &[f32], temperature: f64) -> Vec<f64> {
    let m = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let mut p: Vec<f64> = row.iter().map(|&x| ((x as f64 - m) / temperature).exp()).collect();
    let z: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= z);
    p
}

/// Inverse-CDF sample of unnormalised non-negative weights.
fn sample_weights(w: &[f64], rng: &mut SplitMix) -> u32 {
    let z: f64 = w.iter().sum();
    let u = rng.uniform() * z;
    let mut acc = 0.0;
    let mut last = 0;
    for (i, &x) in w.iter().enumerate() {
        if x > 0.0 {
            acc += x;
            last = i;
            if u < acc {
                return i as u32;
            }
        }
    }
    last as u32
}

/// The outcome of verifying one draft: indices of the accepted nodes (root excluded) along the
/// path, and the bonus token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Accepted node indices, parents first.
    pub path: Vec<usize>,
    /// The token the target adds after the path.
    pub bonus: u32,
}

/// Verify a draft against the target's rows: `rows[0]` are the logits after the root,
/// `rows[1 + i]` after node i. `children_of(None)` are the root's children.
pub fn verify_draft(
    nodes: &[TreeNode],
    q: &[Vec<(u32, f32)>],
    rows: &[Vec<f32>],
    rule: AcceptRule,
    temperature: f64,
    rng: &mut SplitMix,
) -> Verdict {
    let mut path = Vec::new();
    let mut cur: Option<usize> = None;
    loop {
        let row = &rows[cur.map_or(0, |i| i + 1)];
        let children: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].parent == cur).collect();
        match rule {
            AcceptRule::Greedy => {
                let want = argmax(row);
                match children.iter().find(|&&c| nodes[c].target_id == want) {
                    Some(&c) => {
                        path.push(c);
                        cur = Some(c);
                    }
                    None => return Verdict { path, bonus: want },
                }
            }
            AcceptRule::Onehot => {
                let mut p = probs_at(row, temperature);
                let mut accepted = None;
                for &c in &children {
                    let tok = nodes[c].target_id as usize;
                    let mass: f64 = p.iter().sum();
                    if rng.uniform() * mass < p[tok] {
                        accepted = Some(c);
                        break;
                    }
                    p[tok] = 0.0;
                }
                match accepted {
                    Some(c) => {
                        path.push(c);
                        cur = Some(c);
                    }
                    None => return Verdict { path, bonus: sample_weights(&p, rng) },
                }
            }
            AcceptRule::Sampling => {
                let mut p = probs_at(row, temperature);
                let Some(&c) = children.first() else {
                    return Verdict { path, bonus: sample_weights(&p, rng) };
                };
                let tok = nodes[c].target_id;
                let qc = q[c].iter().find(|&&(t, _)| t == tok).map_or(0.0, |&(_, x)| x as f64);
                if qc > 0.0 && rng.uniform() < (p[tok as usize] / qc).min(1.0) {
                    path.push(c);
                    cur = Some(c);
                    continue;
                }
                for &(t, x) in &q[c] {
                    p[t as usize] = (p[t as usize] - x as f64).max(0.0);
                }
                return Verdict { path, bonus: sample_weights(&p, rng) };
            }
        }
    }
}

impl<'a, B: Backend> SpecDecoder<'a, B> {
    /// A decoder; the drafter must read the target's aux layers and share its vocabulary.
    pub fn new(target: &'a TargetModel<B>, drafter: &'a Drafter<B>, stop_ids: Vec<u32>) -> Result<Self> {
        let (cfg, spec) = (drafter.config(), target.spec());
        if cfg.target_hidden_size != spec.hidden_size || cfg.vocab_size != spec.vocab_size {
            return Err(Error::Incompatible(format!(
                "the drafter was built for a target with hidden size {} and vocabulary {}, this target has {} and {}",
                cfg.target_hidden_size, cfg.vocab_size, spec.hidden_size, spec.vocab_size
            )));
        }
        if let Some(&bad) = cfg.aux_layers.input_of_layer().iter().find(|&&k| k > target.num_layers()) {
            return Err(Error::Incompatible(format!(
                "the drafter reads hidden state {bad}, beyond the target's {} layers",
                target.num_layers()
            )));
        }
        let want = CaptureRequest::with_aux(cfg.aux_layers.clone(), LogitsMode::All);
        Ok(Self { target, drafter, want, stop_ids })
    }

    fn ids(&self, ids: &[u32]) -> Tensor<B, 2, Int> {
        let v: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        Tensor::from_data(TensorData::new(v, [1, ids.len()]), &self.target.device())
    }

    fn choose(&self, row: &[f32], temperature: f64, rng: &mut SplitMix) -> u32 {
        if temperature == 0.0 { argmax(row) } else { sample_weights(&probs_at(row, temperature), rng) }
    }

    /// Plain decoding (the baseline): one target forward per token.
    pub fn plain(&self, prompt: &[u32], opts: &DecodeOptions, timings: &mut DecodeTimings) -> Result<PlainAnswer> {
        let mut rng = SplitMix(opts.seed);
        let mut cache = self.target.new_cache();
        let want = CaptureRequest::logits(LogitsMode::Last);
        let t0 = Instant::now();
        let logits = self.target.forward(self.ids(prompt), &mut cache, &want)?.logits.expect("logits asked for");
        let mut token = self.choose(&host_f32(logits), opts.temperature, &mut rng);
        timings.plain_prefill.add(t0);
        let prefill_seconds = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut out = vec![token];
        while out.len() < opts.max_new_tokens && !self.stop_ids.contains(&token) {
            let t = Instant::now();
            let logits = self.target.forward(self.ids(&[token]), &mut cache, &want)?.logits.expect("logits asked for");
            token = self.choose(&host_f32(logits), opts.temperature, &mut rng);
            timings.plain_step.add(t);
            out.push(token);
        }
        Ok(PlainAnswer { tokens: out, decode_seconds: t1.elapsed().as_secs_f64(), prefill_seconds })
    }

    /// Speculative decoding of one answer.
    pub fn speculative(&self, prompt: &[u32], opts: &DecodeOptions, timings: &mut DecodeTimings) -> Result<SpecAnswer> {
        opts.validate(self.drafter.config().draft_vocab_size)?;
        if prompt.is_empty() {
            return Err(Error::Incompatible("an empty prompt cannot be decoded".into()));
        }
        let mut rng = SplitMix(opts.seed);
        let mut cache = self.target.new_cache();
        let mut dcache = DraftKv::<B>::default();

        let t0 = Instant::now();
        let out = self.target.forward(self.ids(prompt), &mut cache, &self.want)?;
        let n = prompt.len();
        let logits = out.logits.clone().expect("logits asked for").narrow(1, n - 1, 1);
        let mut last = self.choose(&host_f32(logits), opts.temperature, &mut rng);
        let mut next_ids: Vec<u32> = prompt[1..].to_vec();
        next_ids.push(last);
        let mut head = self.drafter.extend(&next_ids, out.aux_concat().expect("aux asked for"), &mut dcache)?;
        timings.spec_prefill.add(t0);
        let prefill_seconds = t0.elapsed().as_secs_f64();

        let t1 = Instant::now();
        let mut answer = SpecAnswer { tokens: vec![last], prefill_seconds, ..Default::default() };
        while answer.tokens.len() < opts.max_new_tokens && !self.stop_ids.contains(&last) {
            let tc = Instant::now();
            let draft = self.draft(&head, &dcache, opts, &mut rng, timings)?;
            let (verdict, aux) = self.verify(last, &draft, &mut cache, opts, &mut rng, timings)?;
            // Emit the accepted drafts and the bonus, up to a stop token or the budget.
            let mut emitted: Vec<u32> = verdict.path.iter().map(|&i| draft.nodes[i].target_id).collect();
            emitted.push(verdict.bonus);
            let room = opts.max_new_tokens - answer.tokens.len();
            let stop_at = emitted.iter().position(|t| self.stop_ids.contains(t)).map_or(emitted.len(), |i| i + 1);
            let keep = stop_at.min(room);
            answer.accepted.push(verdict.path.len());
            answer.emitted.push(keep);
            answer.tokens.extend_from_slice(&emitted[..keep]);
            last = *answer.tokens.last().expect("at least one token");
            let done =
                keep < emitted.len() || answer.tokens.len() >= opts.max_new_tokens || self.stop_ids.contains(&last);
            if !done {
                let te = Instant::now();
                head = self.drafter.extend(&emitted, aux, &mut dcache)?;
                timings.extend.add(te);
            }
            timings.cycle.add(tc);
        }
        answer.decode_seconds = t1.elapsed().as_secs_f64();
        Ok(answer)
    }

    /// Draft from the last extended position.
    fn draft(
        &self,
        head: &StepOutput<B>,
        dcache: &DraftKv<B>,
        opts: &DecodeOptions,
        rng: &mut SplitMix,
        timings: &mut DecodeTimings,
    ) -> Result<Draft> {
        let d2t = self.drafter.vocab().d2t();
        let to_target = |d: u32| (d as i64 + d2t[d as usize]) as u32;
        match opts.shape {
            DraftShape::Chain { k } => {
                let mut nodes = Vec::with_capacity(k);
                let mut q = Vec::new();
                let mut out = head.clone();
                let mut path = BranchKv::<B>::default();
                for i in 0..k {
                    let row = host_f32(out.logits.clone());
                    let d = if opts.rule == AcceptRule::Sampling {
                        let p: Vec<f32> = probs_at(&row, opts.temperature).iter().map(|&x| x as f32).collect();
                        let d = sample_index(&p, rng.uniform()) as u32;
                        q.push(p.iter().enumerate().map(|(j, &x)| (to_target(j as u32), x)).collect());
                        d
                    } else {
                        argmax(&row)
                    };
                    let node = TreeNode {
                        parent: i.checked_sub(1),
                        depth: i + 1,
                        draft_id: d,
                        target_id: to_target(d),
                        log_score: 0.0,
                    };
                    nodes.push(node);
                    if i + 1 < k {
                        let t = Instant::now();
                        out = self.drafter.draft_step(&[node.target_id], out.hidden.clone(), dcache, &mut path)?;
                        timings.draft_step.add(t);
                    }
                }
                Ok(Draft { nodes, q })
            }
            DraftShape::Tree { depth, topk, tokens } => {
                let mut nodes: Vec<TreeNode> = Vec::new();
                let mut frontier: Vec<usize> = Vec::new();
                for (lq, d) in top_children(head.logits.clone(), topk).remove(0) {
                    frontier.push(nodes.len());
                    nodes.push(TreeNode {
                        parent: None,
                        depth: 1,
                        draft_id: d,
                        target_id: to_target(d),
                        log_score: lq,
                    });
                }
                let mut hidden = Tensor::cat(vec![head.hidden.clone(); frontier.len()], 0);
                let mut path = BranchKv::<B>::default();
                for level in 2..=depth {
                    let ids: Vec<u32> = frontier.iter().map(|&i| nodes[i].target_id).collect();
                    let t = Instant::now();
                    let out = self.drafter.draft_step(&ids, hidden, dcache, &mut path)?;
                    timings.draft_step.add(t);
                    let children = top_children(out.logits, topk);
                    let mut cands: Vec<(usize, usize)> = Vec::new(); // (node, frontier row)
                    for (row, &leaf) in frontier.iter().enumerate() {
                        let base = nodes[leaf].log_score;
                        for &(lq, d) in &children[row] {
                            cands.push((nodes.len(), row));
                            nodes.push(TreeNode {
                                parent: Some(leaf),
                                depth: level,
                                draft_id: d,
                                target_id: to_target(d),
                                log_score: base + lq,
                            });
                        }
                    }
                    cands.sort_by(|&(x, _), &(y, _)| nodes[y].log_score.total_cmp(&nodes[x].log_score).then(x.cmp(&y)));
                    cands.truncate(topk);
                    let rows: Vec<usize> = cands.iter().map(|&(_, r)| r).collect();
                    frontier = cands.iter().map(|&(n, _)| n).collect();
                    hidden = out.hidden.select(0, row_index::<B>(&rows, &self.target.device()));
                    path = path.select(&rows);
                }
                Ok(Draft { nodes: prune(nodes, tokens - 1), q: Vec::new() })
            }
        }
    }

    /// One verify pass over [last, drafts]; keeps the accepted path in `cache` and returns the
    /// verdict with the aux features of [root, path] (what the drafter extends over next).
    fn verify(
        &self,
        last: u32,
        draft: &Draft,
        cache: &mut TargetCache<B>,
        opts: &DecodeOptions,
        rng: &mut SplitMix,
        timings: &mut DecodeTimings,
    ) -> Result<(Verdict, Tensor<B, 3>)> {
        let device = self.target.device();
        let p = cache.len();
        let s = 1 + draft.nodes.len();
        let mut ids = vec![last];
        ids.extend(draft.nodes.iter().map(|n| n.target_id));
        let positions: Vec<usize> = std::iter::once(p).chain(draft.nodes.iter().map(|n| p + n.depth)).collect();
        let is_chain = draft.nodes.iter().enumerate().all(|(i, n)| n.parent == i.checked_sub(1));
        let mask = (!is_chain).then(|| tree_mask::<B>(&draft.nodes, p, &device));
        let t = Instant::now();
        let out = self.target.forward_with_mask(self.ids(&ids), positions, cache, mask, &self.want)?;
        let logits = host_f32(out.logits.clone().expect("logits asked for"));
        timings.verify.entry(s).or_default().add(t);
        let v = self.target.spec().vocab_size;
        let rows: Vec<Vec<f32>> = logits.chunks(v).map(<[f32]>::to_vec).collect();
        let verdict = verify_draft(&draft.nodes, &draft.q, &rows, opts.rule, opts.temperature, rng);
        let keep_new: Vec<usize> = std::iter::once(0).chain(verdict.path.iter().map(|&i| i + 1)).collect();
        if is_chain {
            cache.truncate(p + keep_new.len());
        } else {
            let keep: Vec<usize> = (0..p).chain(keep_new.iter().map(|&i| p + i)).collect();
            cache.retain(&keep)?;
        }
        let aux = out.aux_concat().expect("aux asked for").select(1, row_index::<B>(&keep_new, &device));
        Ok((verdict, aux))
    }
}

/// `[1, 1, S, p + S]`, true = masked: each verified token sees the cached prefix, the root, its
/// ancestors and itself.
fn tree_mask<B: Backend>(nodes: &[TreeNode], p: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let s = 1 + nodes.len();
    let mut visible = vec![vec![false; s]; s];
    visible[0][0] = true;
    for (i, n) in nodes.iter().enumerate() {
        let row = i + 1;
        visible[row][0] = true;
        visible[row][row] = true;
        let mut a = n.parent;
        while let Some(j) = a {
            visible[row][j + 1] = true;
            a = nodes[j].parent;
        }
    }
    let mut mask = Vec::with_capacity(s * (p + s));
    for row in &visible {
        mask.extend(std::iter::repeat_n(false, p));
        mask.extend(row.iter().map(|&v| !v));
    }
    Tensor::from_data(TensorData::new(mask, [1, 1, s, p + s]), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain_nodes(tokens: &[u32]) -> Vec<TreeNode> {
        tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| TreeNode {
                parent: i.checked_sub(1),
                depth: i + 1,
                draft_id: t,
                target_id: t,
                log_score: 0.0,
            })
            .collect()
    }

    fn logits_of(p: &[f64]) -> Vec<f32> {
        p.iter().map(|&x| x.ln() as f32).collect()
    }

    #[test]
    fn greedy_follows_the_argmax() {
        let nodes = chain_nodes(&[1, 2, 0]);
        let rows = vec![vec![0.0, 5.0, 1.0], vec![0.0, 1.0, 5.0], vec![5.0, 1.0, 0.0], vec![0.0, 0.0, 9.0]];
        let v = verify_draft(&nodes, &[], &rows, AcceptRule::Greedy, 0.0, &mut SplitMix(0));
        assert_eq!(v, Verdict { path: vec![0, 1, 2], bonus: 2 });
        let rows2 = vec![vec![0.0, 5.0, 1.0], vec![9.0, 1.0, 5.0], rows[2].clone(), rows[3].clone()];
        let v = verify_draft(&nodes, &[], &rows2, AcceptRule::Greedy, 0.0, &mut SplitMix(0));
        assert_eq!(v, Verdict { path: vec![0], bonus: 0 });
    }

    /// The first emitted token's distribution under each sampling rule is the target's p, by
    /// Monte Carlo: 200k draws, tolerance 5σ of a binomial proportion (≈ 0.005 at p = 0.3).
    #[test]
    fn sampling_rules_are_lossless() {
        let p = [0.5, 0.3, 0.15, 0.05];
        let q = [0.1, 0.6, 0.2, 0.1];
        let rows = vec![logits_of(&p), logits_of(&[0.25; 4])];
        let draws = 200_000;
        let check = |counts: &[u64], what: &str| {
            for (i, &c) in counts.iter().enumerate() {
                let f = c as f64 / draws as f64;
                let sigma = (p[i] * (1.0 - p[i]) / draws as f64).sqrt();
                assert!((f - p[i]).abs() < 5.0 * sigma, "{what}: token {i} frequency {f} vs p {}", p[i]);
            }
        };
        // sampling: the draft drawn from q, accepted with min(1, p/q).
        let mut rng = SplitMix(11);
        let mut counts = [0u64; 4];
        let qv: Vec<(u32, f32)> = q.iter().enumerate().map(|(i, &x)| (i as u32, x as f32)).collect();
        for _ in 0..draws {
            let qf: Vec<f32> = q.iter().map(|&x| x as f32).collect();
            let d = sample_index(&qf, rng.uniform()) as u32;
            let nodes = chain_nodes(&[d]);
            let v = verify_draft(&nodes, std::slice::from_ref(&qv), &rows, AcceptRule::Sampling, 1.0, &mut rng);
            counts[if v.path.is_empty() { v.bonus } else { d } as usize] += 1;
        }
        check(&counts, "sampling");
        // onehot over a tree: three fixed siblings tried in order, then the residual.
        let mut rng = SplitMix(12);
        let mut counts = [0u64; 4];
        let nodes: Vec<TreeNode> = [1u32, 0, 3]
            .iter()
            .map(|&t| TreeNode { parent: None, depth: 1, draft_id: t, target_id: t, log_score: 0.0 })
            .collect();
        let rows3 = vec![logits_of(&p), rows[1].clone(), rows[1].clone(), rows[1].clone()];
        for _ in 0..draws {
            let v = verify_draft(&nodes, &[], &rows3, AcceptRule::Onehot, 1.0, &mut rng);
            counts[v.path.first().map_or(v.bonus, |&i| nodes[i].target_id) as usize] += 1;
        }
        check(&counts, "onehot");
    }

    #[test]
    fn tree_mask_shows_ancestors_only() {
        // root; a (depth 1), b (depth 1), c child of a.
        let nodes = vec![
            TreeNode { parent: None, depth: 1, draft_id: 0, target_id: 0, log_score: 0.0 },
            TreeNode { parent: None, depth: 1, draft_id: 1, target_id: 1, log_score: 0.0 },
            TreeNode { parent: Some(0), depth: 2, draft_id: 2, target_id: 2, log_score: 0.0 },
        ];
        let m: Vec<bool> =
            tree_mask::<burn::backend::Flex>(&nodes, 2, &Default::default()).into_data().iter::<bool>().collect();
        let row = |r: usize| m[r * 6..(r + 1) * 6].to_vec();
        assert_eq!(row(0), vec![false, false, false, true, true, true]);
        assert_eq!(row(2), vec![false, false, false, true, false, true]);
        assert_eq!(row(3), vec![false, false, false, false, true, false]);
    }
}

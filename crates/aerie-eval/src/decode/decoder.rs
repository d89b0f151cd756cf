//! The speculative decoder of one answer, batch 1: prefill the target and extend the drafter over
//! the prompt, then cycle draft → one verify pass → accept → cache updates (the target keeps the
//! accepted path; the drafter extends over it), beside the plain one-token-per-forward baseline
//! it is measured against.

use std::time::Instant;

use aerie_model::drafter::decode::{BranchKv, DraftKv, StepOutput, row_index};
use aerie_model::drafter::offline::sample_index;
use aerie_model::drafter::tree::{TreeNode, prune, top_children};
use aerie_model::rng::SplitMix;
use aerie_model::{CaptureRequest, LogitsMode, TargetModel};
use aerie_model::{Drafter, TargetCache};
use burn::tensor::{Bool, Int, Tensor, TensorData, backend::Backend};

use super::verdict::{argmax, probs_at, sample_weights};
use aerie_model::drafter::shape::{DraftShape, TreeShape};

use super::{DecodeOptions, DecodeTimings, Verdict, verify_draft};
use crate::accept::AcceptRule;
use crate::{Error, Result};
use aerie_model::precision::host_f32;

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
            DraftShape::Tree(TreeShape { depth, topk, verify_tokens: tokens }) => {
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

//! Serving-mode drafting over every position of a captured sequence at once (EAGLE-3, arXiv
//! 2503.01840; dynamic draft trees from EAGLE-2, arXiv 2406.16858), as SGLang's
//! `speculative/eagle_worker.py` drafts after each verify pass.
//!
//! Position t plays the moment right after the target emitted x_{t+1}:
//! - step 0 takes the captured target features f_t with the embedding of x_{t+1} (RoPE position
//!   t, causal attention over the step-0 keys of positions <= t, which are the draft KV cache
//!   serving builds from the accepted prefix);
//! - step k >= 1 takes the drafter's own carried hidden state with the embedding of its OWN
//!   previous draft token (never the captured one), RoPE position t+k, and attends to the step-0
//!   keys plus its own diagonal keys of steps 1..k at position t.
//!
//! The draft at step k of position t proposes x_{t+2+k}. Unlike the teacher-forced TTT forward
//! ([`crate::ttt`]), nothing here looks at captured tokens after x_{t+1}.
//!
//! [`draft_chain`] drafts one token per step (argmax, or a seeded sample at a temperature) and can
//! keep the draft distribution q of every step. [`draft_tree`] expands the top-k children of the
//! k best paths per step and prunes the candidates to N-1 nodes by cumulative draft log-prob, as
//! EAGLE-2 and SGLang (`--speculative-eagle-topk`, `--speculative-num-draft-tokens`) do
//! ([`super::tree`]); the
//! drafter's diagonal cache cannot be re-indexed from outside, so each tree step recomputes its
//! branch's path from the step-0 cache (depth² forwards, fine for evaluation).

use burn::tensor::activation::softmax;
use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use super::shape::{DraftShape, TreeShape};
use super::tree::{TreeNode, prune, top_children};
use super::{Drafter, TttCache, host_ids};
use crate::precision::{host_f32, upcast};
use crate::rng::SplitMix;
use crate::{Error, Result};

/// How chain drafts are chosen from q.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DraftSampling {
    /// argmax q (what SGLang's EAGLE worker does); q is reported at temperature 1.
    Greedy,
    /// A sample of q = softmax(logits / temperature), from a seeded generator.
    Sample {
        /// Temperature (> 0).
        temperature: f64,
        /// Seed of the generator (same seed, same drafts).
        seed: u64,
    },
}

/// Options of [`draft_chain`].
#[derive(Debug, Clone, PartialEq)]
pub struct ChainOptions {
    /// Draft steps k (tokens drafted per position).
    pub steps: usize,
    /// Token choice.
    pub sampling: DraftSampling,
    /// Keep q `[B, L, Vd]` of every step (needed by the sampling and one-hot verification
    /// rules; `K·B·L·Vd` floats).
    pub keep_q: bool,
}

/// Drafts of every position, one chain per position.
#[derive(Debug, Clone)]
pub struct DraftChain<B: Backend> {
    /// Batch size B.
    pub batch: usize,
    /// Padded length L.
    pub len: usize,
    /// Per step, draft-vocabulary ids, row-major `[B·L]` (`b·L + t`).
    pub draft_ids: Vec<Vec<u32>>,
    /// Per step, the same drafts as target ids (`id + d2t[id]`).
    pub target_ids: Vec<Vec<u32>>,
    /// Per step, q `[B, L, Vd]` (empty unless [`ChainOptions::keep_q`]).
    pub q: Vec<Tensor<B, 3>>,
}

/// Pruned draft trees, one per position (`b·L + t`); parents precede children.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftTree {
    /// Batch size B.
    pub batch: usize,
    /// Padded length L.
    pub len: usize,
    /// Nodes of each position's tree.
    pub nodes: Vec<Vec<TreeNode>>,
}

/// Inverse-CDF sample of `probs` (sums to ~1); the last index with mass absorbs rounding.
pub fn sample_index(probs: &[f32], u: f64) -> usize {
    let mut acc = 0.0f64;
    let mut last = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            acc += p as f64;
            last = i;
            if u < acc {
                return i;
            }
        }
    }
    last
}

fn ids_tensor<B: Backend>(ids: &[u32], shape: [usize; 2], device: &B::Device) -> Tensor<B, 2, Int> {
    let v: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(v, shape), device)
}

/// The shared start of both drafting modes: shapes checked, step-0 inputs.
struct Start<B: Backend> {
    b: usize,
    l: usize,
    hidden: Tensor<B, 3>,
    ids0: Tensor<B, 2, Int>,
}

fn start<B: Backend>(drafter: &Drafter<B>, input_ids: &Tensor<B, 2, Int>, aux: &Tensor<B, 3>) -> Result<Start<B>> {
    let cfg = drafter.config();
    let [b, l] = input_ids.dims();
    let want = [b, l, cfg.num_aux() * cfg.target_hidden_size];
    if aux.dims() != want {
        return Err(Error::Shape(format!("aux features are {:?}, the drafter expects {want:?}", aux.dims())));
    }
    let device = aux.device();
    // Step 0 pairs f_t with x_{t+1}: the one shift (the last position gets a pad id; its drafts
    // can never be verified and are ignored by every consumer).
    let ids0 = if l > 1 {
        Tensor::cat(vec![input_ids.clone().narrow(1, 1, l - 1), Tensor::zeros([b, 1], &device)], 1)
    } else {
        Tensor::zeros([b, l], &device)
    };
    Ok(Start { b, l, hidden: drafter.fuse_aux(aux.clone()), ids0 })
}

/// One draft step: returns (f32 logits `[B, L, Vd]`, carried hidden).
fn step<B: Backend>(
    drafter: &Drafter<B>,
    k: usize,
    ids: Tensor<B, 2, Int>,
    hidden: Tensor<B, 3>,
    cache: &mut TttCache<B>,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let l = ids.dims()[1];
    let (cos, sin) = drafter.rotary().tables::<B>(k, l, &ids.device());
    let out = drafter.midlayer.forward_ttt(drafter.embed(ids), hidden, &cos, &sin, cache);
    (upcast(drafter.logits(out.clone())), drafter.carry(out))
}

fn to_target<B: Backend>(drafter: &Drafter<B>, draft: &[u32]) -> Vec<u32> {
    let d2t = drafter.vocab().d2t();
    draft.iter().map(|&d| (d as i64 + d2t[d as usize]) as u32).collect()
}

/// Draft a chain of `opts.steps` tokens at every position of a right-padded batch:
/// `input_ids [B, L]` are the captured tokens, `aux [B, L, A·Ht]` the captured features.
pub fn draft_chain<B: Backend>(
    drafter: &Drafter<B>,
    input_ids: &Tensor<B, 2, Int>,
    aux: &Tensor<B, 3>,
    opts: &ChainOptions,
) -> Result<DraftChain<B>> {
    if opts.steps == 0 {
        return Err(Error::Shape("draft steps must be at least 1".into()));
    }
    let temperature = match opts.sampling {
        DraftSampling::Greedy => 1.0,
        DraftSampling::Sample { temperature, .. } if temperature > 0.0 && temperature.is_finite() => temperature,
        DraftSampling::Sample { temperature, .. } => {
            return Err(Error::Shape(format!("draft temperature must be > 0, got {temperature}")));
        }
    };
    let Start { b, l, mut hidden, ids0 } = start(drafter, input_ids, aux)?;
    let device = aux.device();
    let vd = drafter.config().draft_vocab_size;
    let mut rng = match opts.sampling {
        DraftSampling::Sample { seed, .. } => Some(SplitMix(seed)),
        DraftSampling::Greedy => None,
    };
    let mut cache = TttCache::default();
    let mut ids = ids0;
    let mut out = DraftChain { batch: b, len: l, draft_ids: Vec::new(), target_ids: Vec::new(), q: Vec::new() };
    for k in 0..opts.steps {
        let (logits, carried) = step(drafter, k, ids, hidden, &mut cache);
        hidden = carried;
        let q = softmax(if temperature == 1.0 { logits.clone() } else { logits.clone().div_scalar(temperature) }, 2);
        let draft = match rng.as_mut() {
            None => host_ids(logits.argmax(2).reshape([b, l])),
            Some(rng) => {
                let probs = host_f32(q.clone());
                probs.chunks(vd).map(|row| sample_index(row, rng.uniform()) as u32).collect()
            }
        };
        let target = to_target(drafter, &draft);
        ids = ids_tensor::<B>(&target, [b, l], &device);
        if opts.keep_q {
            out.q.push(q);
        }
        out.draft_ids.push(draft);
        out.target_ids.push(target);
    }
    Ok(out)
}

/// Draft an EAGLE-2 tree at every position of a right-padded batch (see the module docs).
pub fn draft_tree<B: Backend>(
    drafter: &Drafter<B>,
    input_ids: &Tensor<B, 2, Int>,
    aux: &Tensor<B, 3>,
    opts: &TreeShape,
) -> Result<DraftTree> {
    let vd = drafter.config().draft_vocab_size;
    DraftShape::Tree(*opts).check(vd).map_err(Error::Shape)?;
    let (depth, w) = (opts.depth, opts.topk);
    // Branch w of batch row b lives in expanded row w·B + b.
    let [b, l] = input_ids.dims();
    let ids_x = Tensor::cat(vec![input_ids.clone(); w], 0);
    let aux_x = Tensor::cat(vec![aux.clone(); w], 0);
    let Start { hidden, ids0, .. } = start(drafter, &ids_x, &aux_x)?;
    let device = aux.device();
    let mut cache0 = TttCache::default();
    let (logits0, hidden0) = step(drafter, 0, ids0, hidden, &mut cache0);
    let positions = b * l;
    let mut nodes: Vec<Vec<TreeNode>> = vec![Vec::new(); positions];
    let mut frontier: Vec<Vec<usize>> = vec![Vec::new(); positions];
    let root = top_children(logits0.narrow(0, 0, b), w);
    for (pos, children) in root.into_iter().enumerate() {
        for (lq, d) in children {
            frontier[pos].push(nodes[pos].len());
            nodes[pos].push(TreeNode { parent: None, depth: 1, draft_id: d, target_id: 0, log_score: lq });
        }
    }
    let d2t = drafter.vocab().d2t();
    let fix_target = |n: &mut TreeNode| n.target_id = (n.draft_id as i64 + d2t[n.draft_id as usize]) as u32;
    nodes.iter_mut().flatten().for_each(&fix_target);

    for i in 1..depth {
        // Recompute each branch's path (depth 1..=i tokens) from the step-0 cache.
        let mut cache = cache0.clone();
        let mut hidden = hidden0.clone();
        let mut logits = None;
        for j in 1..=i {
            let mut ids = vec![0u32; w * positions];
            for pos in 0..positions {
                for (br, &leaf) in frontier[pos].iter().enumerate() {
                    let mut n = leaf;
                    while nodes[pos][n].depth > j {
                        n = nodes[pos][n].parent.expect("depth > 1 has a parent");
                    }
                    ids[br * positions + pos] = nodes[pos][n].target_id;
                }
            }
            let (lg, carried) = step(drafter, j, ids_tensor::<B>(&ids, [w * b, l], &device), hidden, &mut cache);
            hidden = carried;
            logits = Some(lg);
        }
        let children = top_children(logits.expect("i >= 1"), w);
        for pos in 0..positions {
            let mut cands = Vec::with_capacity(w * w);
            for (br, &leaf) in frontier[pos].iter().enumerate() {
                let base = nodes[pos][leaf].log_score;
                for &(lq, d) in &children[br * positions + pos] {
                    let mut node =
                        TreeNode { parent: Some(leaf), depth: i + 1, draft_id: d, target_id: 0, log_score: base + lq };
                    fix_target(&mut node);
                    cands.push(nodes[pos].len());
                    nodes[pos].push(node);
                }
            }
            cands.sort_by(|&x, &y| nodes[pos][y].log_score.total_cmp(&nodes[pos][x].log_score).then(x.cmp(&y)));
            cands.truncate(w);
            frontier[pos] = cands;
        }
    }
    let keep = opts.verify_tokens - 1;
    Ok(DraftTree { batch: b, len: l, nodes: nodes.into_iter().map(|n| prune(n, keep)).collect() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_follows_the_cdf() {
        assert_eq!(sample_index(&[0.25, 0.5, 0.25], 0.1), 0);
        assert_eq!(sample_index(&[0.25, 0.5, 0.25], 0.7), 1);
        assert_eq!(sample_index(&[0.25, 0.5, 0.25], 0.9999), 2);
        assert_eq!(sample_index(&[0.5, 0.5, 0.0], 1.0), 1);
        let mut r = SplitMix(7);
        assert!((0..1000).map(|_| r.uniform()).all(|u| (0.0..1.0).contains(&u)));
    }
}

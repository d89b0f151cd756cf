//! The EAGLE-2 draft tree (arXiv 2406.16858) as both drafting modes grow it, offline over every
//! position ([`super::offline::draft_tree`]) and at decode time (aerie-eval's decoder over
//! [`super::decode`]): the top-k children of a node by draft log-prob, and the pruning of the
//! candidates to the N-1 nodes the target verifies, ranked by cumulative log-prob as SGLang
//! (`--speculative-eagle-topk`, `--speculative-num-draft-tokens`) ranks them.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Tensor, backend::Backend};

use super::host_ids;
use crate::precision::host_f32;

/// One drafted tree node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TreeNode {
    /// Index of the parent within the same position's node list; `None` under the root.
    pub parent: Option<usize>,
    /// 1 for children of the root: the node proposes x_{t+1+depth}.
    pub depth: usize,
    /// Draft-vocabulary id.
    pub draft_id: u32,
    /// Target id.
    pub target_id: u32,
    /// Σ log q along the path (the EAGLE-2 ranking score).
    pub log_score: f64,
}

/// Top-`w` (log q, draft id) per row of f32 logits `[R, L, Vd]`, on the host as `[R·L][w]`.
pub fn top_children<B: Backend>(logits: Tensor<B, 3>, w: usize) -> Vec<Vec<(f64, u32)>> {
    let (vals, idx) = log_softmax(logits, 2).topk_with_indices(w, 2);
    let vals = host_f32(vals);
    let idx = host_ids(idx);
    vals.chunks(w)
        .zip(idx.chunks(w))
        .map(|(v, i)| v.iter().map(|&x| x as f64).zip(i.iter().copied()).collect())
        .collect()
}

/// Keep the `keep` nodes of highest score (ties: shallower, then earlier), re-indexed with parents
/// first. Scores never increase along a path, so every kept node's parent is kept too.
pub fn prune(nodes: Vec<TreeNode>, keep: usize) -> Vec<TreeNode> {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&x, &y| {
        let (a, b) = (&nodes[x], &nodes[y]);
        b.log_score.total_cmp(&a.log_score).then(a.depth.cmp(&b.depth)).then(x.cmp(&y))
    });
    order.truncate(keep);
    order.sort_by_key(|&i| (nodes[i].depth, i));
    let mut new_index = vec![usize::MAX; nodes.len()];
    let mut out = Vec::with_capacity(order.len());
    for &i in &order {
        let mut n = nodes[i];
        match n.parent.map(|p| new_index[p]) {
            Some(usize::MAX) => continue, // parent pruned (only on exact score ties across depths)
            parent => n.parent = parent,
        }
        new_index[i] = out.len();
        out.push(n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(parent: Option<usize>, depth: usize, score: f64) -> TreeNode {
        TreeNode { parent, depth, draft_id: 0, target_id: 0, log_score: score }
    }

    #[test]
    fn prune_keeps_best_paths_parents_first() {
        // root children a (-0.1), b (-1.0); a's children c (-0.3), d (-2.0); b's child e (-1.2).
        let nodes = vec![
            node(None, 1, -0.1),
            node(None, 1, -1.0),
            node(Some(0), 2, -0.3),
            node(Some(0), 2, -2.0),
            node(Some(1), 2, -1.2),
        ];
        let kept = prune(nodes, 3);
        assert_eq!(kept.iter().map(|n| n.log_score).collect::<Vec<_>>(), vec![-0.1, -1.0, -0.3]);
        assert_eq!(kept[2].parent, Some(0));
    }
}

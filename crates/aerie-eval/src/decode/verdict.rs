//! The verify step's acceptance rules on host rows of target logits (greedy, onehot, sampling;
//! Leviathan et al., arXiv 2211.17192): which drafts of a chain or tree the target keeps and the
//! bonus token it adds. Pure functions of the rows and the sampler, so their losslessness is
//! tested here without a model.

use aerie_model::drafter::tree::TreeNode;
use aerie_model::rng::SplitMix;

use crate::accept::AcceptRule;

pub(super) fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// softmax(row / T) in f64.
pub(super) fn probs_at(row: &[f32], temperature: f64) -> Vec<f64> {
    let m = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let mut p: Vec<f64> = row.iter().map(|&x| ((x as f64 - m) / temperature).exp()).collect();
    let z: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= z);
    p
}

/// Inverse-CDF sample of unnormalised non-negative weights.
pub(super) fn sample_weights(w: &[f64], rng: &mut SplitMix) -> u32 {
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

#[cfg(test)]
mod tests {
    use aerie_model::drafter::offline::sample_index;

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
}

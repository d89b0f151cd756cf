//! Serving-mode drafting ([`aerie_model::draft`]): causality (the drafts at position t depend on
//! nothing after x_{t+1}), padding invariance, chain/tree agreement, seeded sampling, and q.

mod reference;

use aerie_model::Drafter;
use aerie_model::draft::{ChainOptions, DraftChain, DraftSampling, TreeOptions, draft_chain, draft_tree};
use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use reference::{random_sequence, random_tiny_checkpoint, tiny_config};

type B = Flex;

struct Case {
    drafter: Drafter<B>,
    ids: Vec<i64>,
    aux: Vec<f32>,
    aw: usize,
}

fn case(len: usize, seed: u64) -> Case {
    let cfg = tiny_config();
    let w = random_tiny_checkpoint(&cfg, seed);
    let drafter = Drafter::<B>::from_tensors(&cfg, &w, &Default::default()).unwrap();
    let s = random_sequence(&cfg, len, seed + 1);
    let aux = s.aux.iter().flatten().map(|&x| x as f32).collect();
    Case { drafter, ids: s.ids, aux, aw: cfg.num_aux() * cfg.target_hidden_size }
}

fn run(c: &Case, rows: &[(Vec<i64>, Vec<f32>)], opts: &ChainOptions) -> DraftChain<B> {
    let dev = Default::default();
    let l = rows.iter().map(|r| r.0.len()).max().unwrap();
    let b = rows.len();
    let mut ids = vec![0i64; b * l];
    let mut aux = vec![0f32; b * l * c.aw];
    for (i, (x, f)) in rows.iter().enumerate() {
        ids[i * l..i * l + x.len()].copy_from_slice(x);
        aux[i * l * c.aw..i * l * c.aw + f.len()].copy_from_slice(f);
    }
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [b, l]), &dev);
    let aux = Tensor::<B, 3>::from_data(TensorData::new(aux, [b, l, c.aw]), &dev);
    draft_chain(&c.drafter, &ids, &aux, opts).unwrap()
}

fn greedy(steps: usize) -> ChainOptions {
    ChainOptions { steps, sampling: DraftSampling::Greedy, keep_q: false }
}

fn at(chain: &DraftChain<B>, b: usize, t: usize) -> Vec<u32> {
    chain.target_ids.iter().map(|s| s[b * chain.len + t]).collect()
}

#[test]
fn drafts_at_t_depend_only_on_the_prefix() {
    let c = case(12, 3);
    let full = run(&c, &[(c.ids.clone(), c.aux.clone())], &greedy(4));
    for t in [0, 3, 7, 9] {
        // Truncate after x_{t+1} (features up to t+1 too) and scramble nothing else: same drafts.
        let n = t + 2;
        let short = run(&c, &[(c.ids[..n].to_vec(), c.aux[..n * c.aw].to_vec())], &greedy(4));
        assert_eq!(at(&short, 0, t), at(&full, 0, t), "position {t}");
        // Changing captured tokens after x_{t+1} changes nothing at t (drafts feed themselves).
        let mut ids = c.ids.clone();
        for x in ids.iter_mut().skip(t + 2) {
            *x = (*x + 1) % 40;
        }
        let changed = run(&c, &[(ids, c.aux.clone())], &greedy(4));
        assert_eq!(at(&changed, 0, t), at(&full, 0, t), "position {t} after changing later tokens");
    }
}

#[test]
fn later_steps_consume_their_own_drafts() {
    // Step 1 at position t sees x_{t+1} only through step 0; replacing x_{t+1} changes step 0's
    // input and hence (almost surely) the chain, while the draft of step 0 at t-1 is untouched.
    let c = case(10, 5);
    let full = run(&c, &[(c.ids.clone(), c.aux.clone())], &greedy(3));
    let d2t = c.drafter.vocab().d2t();
    for (k, step) in full.draft_ids.iter().enumerate() {
        for (p, &d) in step.iter().enumerate() {
            assert_eq!(full.target_ids[k][p] as i64, d as i64 + d2t[d as usize], "d2t mapping at step {k}");
        }
    }
    let distinct: std::collections::BTreeSet<u32> = full.target_ids.iter().flatten().copied().collect();
    assert!(distinct.len() > 1, "a random drafter should not draft one token everywhere");
}

#[test]
fn right_padding_changes_nothing() {
    let c = case(11, 7);
    let alone = run(&c, &[(c.ids[..7].to_vec(), c.aux[..7 * c.aw].to_vec())], &greedy(3));
    let padded =
        run(&c, &[(c.ids.clone(), c.aux.clone()), (c.ids[..7].to_vec(), c.aux[..7 * c.aw].to_vec())], &greedy(3));
    for t in 0..6 {
        assert_eq!(at(&padded, 1, t), at(&alone, 0, t), "position {t}");
    }
}

#[test]
fn a_topk_1_tree_is_the_greedy_chain() {
    let c = case(9, 11);
    let dev = Default::default();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(c.ids.clone(), [1, 9]), &dev);
    let aux = Tensor::<B, 3>::from_data(TensorData::new(c.aux.clone(), [1, 9, c.aw]), &dev);
    let chain = draft_chain(&c.drafter, &ids, &aux, &greedy(3)).unwrap();
    let tree = draft_tree(&c.drafter, &ids, &aux, &TreeOptions { depth: 3, topk: 1, verify_tokens: 4 }).unwrap();
    for t in 0..9 {
        let path: Vec<u32> = tree.nodes[t].iter().map(|n| n.target_id).collect();
        assert_eq!(path, at(&chain, 0, t), "position {t}");
        assert!(tree.nodes[t].windows(2).all(|w| w[1].log_score <= w[0].log_score));
    }
    // A wider tree keeps exactly N-1 nodes whose parents precede them, best child first.
    let wide = draft_tree(&c.drafter, &ids, &aux, &TreeOptions { depth: 3, topk: 2, verify_tokens: 6 }).unwrap();
    for nodes in &wide.nodes {
        assert_eq!(nodes.len(), 5);
        for (i, n) in nodes.iter().enumerate() {
            assert!(n.parent.is_none_or(|p| p < i && nodes[p].depth + 1 == n.depth));
        }
    }
}

#[test]
fn sampling_is_seeded_and_q_is_a_distribution() {
    let c = case(8, 13);
    let opts =
        |seed| ChainOptions { steps: 2, sampling: DraftSampling::Sample { temperature: 1.5, seed }, keep_q: true };
    let a = run(&c, &[(c.ids.clone(), c.aux.clone())], &opts(1));
    let b = run(&c, &[(c.ids.clone(), c.aux.clone())], &opts(1));
    let other = run(&c, &[(c.ids.clone(), c.aux.clone())], &opts(2));
    assert_eq!(a.draft_ids, b.draft_ids);
    assert_ne!(a.draft_ids, other.draft_ids, "different seeds should sample differently somewhere");
    assert_eq!(a.q.len(), 2);
    let sums: Vec<f32> = a.q[1].clone().sum_dim(2).into_data().iter::<f32>().collect();
    assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-4), "{sums:?}");
    let bad = ChainOptions { steps: 1, sampling: DraftSampling::Sample { temperature: 0.0, seed: 0 }, keep_q: false };
    let dev = Default::default();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(c.ids.clone(), [1, 8]), &dev);
    let aux = Tensor::<B, 3>::from_data(TensorData::new(c.aux.clone(), [1, 8, c.aw]), &dev);
    assert!(draft_chain(&c.drafter, &ids, &aux, &bad).is_err());
}

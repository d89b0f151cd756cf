//! Serving-mode drafting ([`aerie_model::drafter::offline`]): causality (the drafts at position t depend on
//! nothing after x_{t+1}), padding invariance, chain/tree agreement, seeded sampling, and q.

mod reference;

use aerie_model::Drafter;
use aerie_model::drafter::offline::{ChainOptions, DraftChain, DraftSampling, draft_chain, draft_tree};
use aerie_model::drafter::shape::TreeShape;
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
    let tree = draft_tree(&c.drafter, &ids, &aux, &TreeShape { depth: 3, topk: 1, verify_tokens: 4 }).unwrap();
    for t in 0..9 {
        let path: Vec<u32> = tree.nodes[t].iter().map(|n| n.target_id).collect();
        assert_eq!(path, at(&chain, 0, t), "position {t}");
        assert!(tree.nodes[t].windows(2).all(|w| w[1].log_score <= w[0].log_score));
    }
    // A wider tree keeps exactly N-1 nodes whose parents precede them, best child first.
    let wide = draft_tree(&c.drafter, &ids, &aux, &TreeShape { depth: 3, topk: 2, verify_tokens: 6 }).unwrap();
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

mod decode_mode {
    //! [`aerie_model::drafter::decode`]: the KV-cached drafter of real speculative decoding agrees with the
    //! all-positions drafting above (tolerance 1e-5 relative on q: same f32 arithmetic in a
    //! different order of matmuls).

    use super::*;
    use aerie_model::drafter::decode::{BranchKv, DraftKv};
    use burn::tensor::activation::softmax;

    fn aux_rows(c: &Case, from: usize, to: usize) -> Tensor<B, 3> {
        let v = c.aux[from * c.aw..to * c.aw].to_vec();
        Tensor::from_data(TensorData::new(v, [1, to - from, c.aw]), &Default::default())
    }

    fn next_ids(c: &Case, from: usize, to: usize) -> Vec<u32> {
        c.ids[from + 1..to + 1].iter().map(|&i| i as u32).collect()
    }

    fn host(t: Tensor<B, 3>) -> Vec<f32> {
        t.into_data().iter::<f32>().collect()
    }

    fn argmax(v: &[f32]) -> u32 {
        v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32
    }

    fn close(a: &[f32], b: &[f32]) {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * scale.max(1e-3), "{x} vs {y}");
        }
    }

    #[test]
    fn cached_chain_equals_all_positions_drafting() {
        let c = case(12, 5);
        let steps = 4;
        let opts = ChainOptions { steps, sampling: DraftSampling::Greedy, keep_q: true };
        let full = run(&c, &[(c.ids.clone(), c.aux.clone())], &opts);
        let vd = c.drafter.config().draft_vocab_size;
        let d2t = c.drafter.vocab().d2t().to_vec();
        for t in [0usize, 4, 10] {
            // Extend positions 0..=t in two pieces (prefill, then one verify's worth).
            let mut cache = DraftKv::<B>::default();
            let cut = t / 2;
            if cut > 0 {
                c.drafter.extend(&next_ids(&c, 0, cut), aux_rows(&c, 0, cut), &mut cache).unwrap();
            }
            let mut out = c.drafter.extend(&next_ids(&c, cut, t + 1), aux_rows(&c, cut, t + 1), &mut cache).unwrap();
            assert_eq!(cache.len(), t + 1);
            let mut path = BranchKv::<B>::default();
            for k in 0..steps {
                let q = host(softmax(out.logits.clone(), 2));
                let want_q = host(full.q[k].clone().narrow(1, t, 1));
                close(&q, &want_q);
                let d = argmax(&q);
                assert_eq!(d, full.draft_ids[k][t], "step {k} at t {t}");
                assert_eq!(q.len(), vd);
                let target = (d as i64 + d2t[d as usize]) as u32;
                if k + 1 < steps {
                    out = c.drafter.draft_step(&[target], out.hidden.clone(), &cache, &mut path).unwrap();
                }
            }
            assert_eq!(path.depth(), steps - 1);
        }
    }

    #[test]
    fn branches_in_one_step_equal_separate_chains() {
        let c = case(9, 7);
        let mut cache = DraftKv::<B>::default();
        let first = c.drafter.extend(&next_ids(&c, 0, 6), aux_rows(&c, 0, 6), &mut cache).unwrap();
        let tokens = [3u32, 11, 5];
        let alone: Vec<(Vec<f32>, Vec<f32>)> = tokens
            .iter()
            .map(|&tok| {
                let mut path = BranchKv::default();
                let o1 = c.drafter.draft_step(&[tok], first.hidden.clone(), &cache, &mut path).unwrap();
                let o2 = c.drafter.draft_step(&[2], o1.hidden.clone(), &cache, &mut path).unwrap();
                (host(o1.logits), host(o2.logits))
            })
            .collect();
        // All three as one batch of branches, then a re-ordering select before the second step.
        let mut path = BranchKv::default();
        let hidden = Tensor::cat(vec![first.hidden.clone(); 3], 0);
        let o1 = c.drafter.draft_step(&tokens, hidden, &cache, &mut path).unwrap();
        let vd = c.drafter.config().draft_vocab_size;
        let l1 = host(o1.logits.clone());
        for (i, (want, _)) in alone.iter().enumerate() {
            close(&l1[i * vd..(i + 1) * vd], want);
        }
        let order = [2usize, 0, 1];
        let mut path = path.select(&order);
        let rows = aerie_model::drafter::decode::row_index::<B>(&order, &Default::default());
        let o2 = c.drafter.draft_step(&[2, 2, 2], o1.hidden.select(0, rows), &cache, &mut path).unwrap();
        let l2 = host(o2.logits);
        for (r, &i) in order.iter().enumerate() {
            close(&l2[r * vd..(r + 1) * vd], &alone[i].1);
        }
    }
}

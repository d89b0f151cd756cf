//! The burn TTT forward against the straightforward f64 reference (`reference/`), padding
//! invariance, the chunked teacher, and gradients by finite differences.
//!
//! Tolerances: f32 burn vs f64 reference agree to 1e-5 relative on sums of O(10) terms (f32 has
//! 6e-8 unit roundoff; a few hundred accumulated ops stay well below 1e-5). Finite differences run
//! the burn forward in f64, central differences with step 2^-17: truncation error O(1e-10),
//! cancellation O(1e-11), so 1e-6 relative is a safe bound.

mod reference;

use aerie_data::vocab::DraftVocab;
use aerie_model::checkpoint::{HostTensor, TensorMap};
use aerie_model::teacher::targets_from_topk;
use aerie_model::ttt::{LossPath, TttOutput, ttt_forward_with};
use aerie_model::{Drafter, DrafterConfig, RopeScaling, TargetHead, TeacherTargets, TttBatch, TttOptions, ttt_forward};
use burn::backend::{Autodiff, Flex};
use burn::module::Param;
use burn::tensor::{DType, Int, Tensor, TensorData, backend::Backend};
use reference::{RefSequence, RefTtt, plain_yarn, random_sequence, random_tiny_checkpoint, ref_ttt, tiny_config};

type B = Flex;

fn flat(rows: &[Vec<f64>]) -> Vec<f64> {
    rows.iter().flatten().copied().collect()
}

fn vocab_of(cfg: &DrafterConfig, w: &TensorMap) -> DraftVocab {
    DraftVocab::from_d2t(&w["d2t"].to_i64("d2t").unwrap(), cfg.vocab_size).unwrap()
}

/// Pad sequences on the right into one batch; the teacher comes from the final hidden states and
/// the (shared) target head of `head_of`.
fn batch<Bk: Backend>(
    cfg: &DrafterConfig,
    w: &TensorMap,
    seqs: &[&RefSequence],
    head_of: &RefSequence,
    dtype: DType,
    chunk_rows: usize,
) -> TttBatch<Bk> {
    let dev = Default::default();
    let l = seqs.iter().map(|s| s.ids.len()).max().unwrap();
    let b = seqs.len();
    let (aw, ht) = (cfg.num_aux() * cfg.target_hidden_size, cfg.target_hidden_size);
    let mut ids = vec![0i64; b * l];
    let mut mask = vec![0f64; b * l];
    let mut valid = vec![0f64; b * l];
    let mut aux = vec![0f64; b * l * aw];
    let mut fin = vec![0f64; b * l * ht];
    for (i, s) in seqs.iter().enumerate() {
        let n = s.ids.len();
        for t in 0..n {
            ids[i * l + t] = s.ids[t];
            mask[i * l + t] = s.loss_mask[t];
            valid[i * l + t] = 1.0;
            aux[(i * l + t) * aw..(i * l + t + 1) * aw].copy_from_slice(&s.aux[t]);
            fin[(i * l + t) * ht..(i * l + t + 1) * ht].copy_from_slice(&s.final_hidden[t]);
        }
    }
    let f = |v: Vec<f64>, shape: Vec<usize>| {
        Tensor::<Bk, 1>::from_data(TensorData::new(v, [shape.iter().product::<usize>()]), &dev).cast(dtype)
    };
    let head = f(flat(&head_of.target_lm_head), vec![cfg.vocab_size * ht]).reshape([cfg.vocab_size, ht]);
    let head = TargetHead::new(head, &vocab_of(cfg, w), chunk_rows);
    TttBatch {
        input_ids: Tensor::<Bk, 2, Int>::from_data(TensorData::new(ids, [b, l]), &dev),
        loss_mask: f(mask, vec![b * l]).reshape([b, l]),
        valid: f(valid, vec![b * l]).reshape([b, l]),
        aux: f(aux, vec![b * l * aw]).reshape([b, l, aw]),
        teacher: head.targets(f(fin, vec![b * l * ht]).reshape([b, l, ht])),
    }
}

fn with_embed(cfg: &DrafterConfig, seed: u64) -> TensorMap {
    let w = random_tiny_checkpoint(cfg, seed);
    assert!(w.contains_key("embed_tokens.weight"));
    w
}

fn per_seq(out: &aerie_model::ttt::TttOutput<B>, i: usize) -> RefTtt {
    let get = |t: &Tensor<B, 1>| t.clone().cast(DType::F64).into_data().into_vec::<f64>().unwrap()[i];
    let mut r = RefTtt::default();
    for s in &out.steps {
        r.ce_sum.push(get(&s.ce_sum));
        r.correct.push(get(&s.correct));
        r.m_count.push(get(&s.m_count));
        r.pm_count.push(get(&s.pm_count));
        r.alpha_sum.push(get(&s.alpha_sum));
    }
    r
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1.0)
}

fn assert_sums_close(what: &str, got: &RefTtt, want: &RefTtt, rel: f64) {
    let fields = [
        ("ce_sum", &got.ce_sum, &want.ce_sum),
        ("correct", &got.correct, &want.correct),
        ("m_count", &got.m_count, &want.m_count),
        ("pm_count", &got.pm_count, &want.pm_count),
        ("alpha_sum", &got.alpha_sum, &want.alpha_sum),
    ];
    for (name, g, w) in fields {
        assert_eq!(g.len(), w.len(), "{what}: {name} step count");
        for k in 0..g.len() {
            assert!(close(g[k], w[k], rel), "{what}: {name}[{k}] = {} vs reference {}", g[k], w[k]);
        }
    }
}

fn reference_for(cfg: &DrafterConfig, w: &TensorMap, s: &RefSequence, head_of: &RefSequence, k: usize) -> RefTtt {
    let logits = reference::ref_teacher_from_hidden(&s.final_hidden, &head_of.target_lm_head);
    ref_ttt(cfg, w, &s.ids, &s.loss_mask, &s.aux, &logits, k)
}

fn check_against_reference(cfg: &DrafterConfig, len: usize, k: usize, seed: u64) {
    let w = with_embed(cfg, seed);
    let s = random_sequence(cfg, len, seed + 1);
    let dev = Default::default();
    let drafter = Drafter::<B>::from_tensors(cfg, &w, &dev).unwrap();
    let out =
        ttt_forward(&drafter, &batch::<B>(cfg, &w, &[&s], &s, DType::F32, 7), &TttOptions::geometric(k, 0.8)).unwrap();
    let want = reference_for(cfg, &w, &s, &s, k);
    assert_sums_close("single sequence", &per_seq(&out, 0), &want, 1e-5);
    let m = reference::ref_metrics(&[want], len);
    let loss = out.loss.into_data().into_vec::<f32>().unwrap()[0] as f64;
    assert!(close(loss, m.loss, 1e-5), "loss {loss} vs {}", m.loss);
}

#[test]
fn ttt_matches_reference_gqa_k7() {
    // GQA (4 heads / 2 KV), head_dim 6 != H/nH, Ht 12 != H 16, reduced vocab, K = 7.
    check_against_reference(&tiny_config(), 11, 7, 1);
}

#[test]
fn ttt_matches_reference_k_longer_than_sequence() {
    check_against_reference(&tiny_config(), 4, 7, 2);
}

#[test]
fn ttt_matches_reference_eagle31_options() {
    let mut cfg = tiny_config();
    cfg.fc_norm = true;
    cfg.norm_output = true;
    check_against_reference(&cfg, 9, 3, 3);
    let mut cfg = tiny_config();
    cfg.norm_before_residual = true;
    cfg.num_key_value_heads = 1;
    check_against_reference(&cfg, 9, 3, 4);
}

#[test]
fn ttt_matches_reference_rope_scalings() {
    for (i, scaling) in [
        RopeScaling::Linear { factor: 4.0 },
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 16,
        },
        plain_yarn(4.0, 16),
    ]
    .into_iter()
    .enumerate()
    {
        let mut cfg = tiny_config();
        cfg.rope.theta = 500.0;
        cfg.rope.scaling = scaling;
        check_against_reference(&cfg, 10, 3, 10 + i as u64);
    }
}

#[test]
fn padded_batch_gives_each_sequence_its_own_sums() {
    let cfg = tiny_config();
    let w = with_embed(&cfg, 5);
    let seqs: Vec<RefSequence> =
        [9, 5, 7].iter().enumerate().map(|(i, &n)| random_sequence(&cfg, n, 20 + i as u64)).collect();
    let dev = Default::default();
    let drafter = Drafter::<B>::from_tensors(&cfg, &w, &dev).unwrap();
    let opts = TttOptions::geometric(7, 0.8);
    let refs: Vec<&RefSequence> = seqs.iter().collect();
    let padded = ttt_forward(&drafter, &batch::<B>(&cfg, &w, &refs, &seqs[0], DType::F32, 16), &opts).unwrap();
    assert_eq!(padded.positions, 21);
    let mut wants = Vec::new();
    for (i, s) in seqs.iter().enumerate() {
        let alone = ttt_forward(&drafter, &batch::<B>(&cfg, &w, &[s], &seqs[0], DType::F32, 16), &opts).unwrap();
        assert_sums_close(&format!("sequence {i} padded vs alone"), &per_seq(&padded, i), &per_seq(&alone, 0), 1e-6);
        let want = reference_for(&cfg, &w, s, &seqs[0], 7);
        assert_sums_close(&format!("sequence {i} vs reference"), &per_seq(&padded, i), &want, 1e-5);
        wants.push(want);
    }
    let m = reference::ref_metrics(&wants, 21);
    let loss = padded.loss.into_data().into_vec::<f32>().unwrap()[0] as f64;
    assert!(close(loss, m.loss, 1e-5), "padded loss {loss} vs reference {}", m.loss);
}

#[test]
fn chunked_teacher_matches_unchunked_and_full_topk() {
    let cfg = tiny_config();
    let w = with_embed(&cfg, 6);
    let s = random_sequence(&cfg, 8, 30);
    let a: TeacherTargets<B> = batch::<B>(&cfg, &w, &[&s], &s, DType::F32, 3).teacher;
    let b: TeacherTargets<B> = batch::<B>(&cfg, &w, &[&s], &s, DType::F32, 1000).teacher;
    // A top-k teacher holding every id (k = V) is the full distribution.
    let v = cfg.vocab_size;
    let mut ids = Vec::new();
    let mut lps = Vec::new();
    for row in &s.teacher_logits {
        let lse = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z = lse + row.iter().map(|x| (x - lse).exp()).sum::<f64>().ln();
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&i, &j| row[j].partial_cmp(&row[i]).unwrap());
        ids.extend(order.iter().map(|&i| i as i32));
        lps.extend(order.iter().map(|&i| (row[i] - z) as f32));
    }
    let c: TeacherTargets<B> = targets_from_topk(&ids, &lps, v, [1, 8], &vocab_of(&cfg, &w), &Default::default());
    for (name, x, y) in [("p", &a.p, &b.p), ("pf", &a.pf, &b.pf), ("p topk", &a.p, &c.p), ("pf topk", &a.pf, &c.pf)] {
        let x = x.clone().into_data().into_vec::<f32>().unwrap();
        let y = y.clone().into_data().into_vec::<f32>().unwrap();
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            assert!((p - q).abs() < 1e-5, "{name}[{i}]: {p} vs {q}");
        }
    }
    assert_eq!(
        a.in_draft.clone().into_data().into_vec::<f32>().unwrap(),
        c.in_draft.into_data().into_vec::<f32>().unwrap()
    );
    assert_eq!(a.in_draft.into_data().into_vec::<f32>().unwrap(), b.in_draft.into_data().into_vec::<f32>().unwrap());
}

type AD = Autodiff<Flex>;

fn loss_f64(drafter: &Drafter<AD>, batch: &TttBatch<AD>, opts: &TttOptions) -> f64 {
    ttt_forward(drafter, batch, opts).unwrap().loss.into_data().into_vec::<f64>().unwrap()[0]
}

/// Perturb entry `idx` of a 2-D parameter chosen by `pick` and return the loss.
fn perturbed<F>(
    drafter: &Drafter<AD>,
    batch: &TttBatch<AD>,
    opts: &TttOptions,
    pick: &F,
    idx: [usize; 2],
    delta: f64,
) -> f64
where
    F: Fn(&mut Drafter<AD>) -> &mut Param<Tensor<AD, 2>>,
{
    let mut d = drafter.clone();
    let p = pick(&mut d);
    let w = p.val();
    let [r, c] = w.dims();
    let mut bump = vec![0f64; r * c];
    bump[idx[0] * c + idx[1]] = delta;
    let bump =
        Tensor::<AD, 1>::from_data(TensorData::new(bump, [r * c]), &Default::default()).cast(w.dtype()).reshape([r, c]);
    *p = Param::from_tensor((w + bump).detach());
    loss_f64(&d, batch, opts)
}

#[test]
fn gradients_match_finite_differences() {
    let _alone = aerie_model::autodiff::exclusive();
    let mut cfg = tiny_config();
    cfg.fc_norm = true;
    let w = with_embed(&cfg, 7);
    let s = random_sequence(&cfg, 6, 40);
    let dev = Default::default();
    let drafter = Drafter::<AD>::from_tensors_as(&cfg, &w, &dev, DType::F64).unwrap();
    let batch = batch::<AD>(&cfg, &w, &[&s], &s, DType::F64, 16);
    let opts = TttOptions::geometric(3, 0.8);
    let out = ttt_forward(&drafter, &batch, &opts).unwrap();
    let grads = out.loss.backward();
    type Pick = fn(&mut Drafter<AD>) -> &mut Param<Tensor<AD, 2>>;
    let picks: [(&str, Pick, [usize; 2]); 6] = [
        ("fc", |d| &mut d.fc.weight, [3, 17]),
        ("q_proj", |d| &mut d.midlayer.self_attn.gqa_mut().unwrap().q_proj.weight, [5, 20]),
        ("k_proj", |d| &mut d.midlayer.self_attn.gqa_mut().unwrap().k_proj.weight, [7, 3]),
        ("v_proj", |d| &mut d.midlayer.self_attn.gqa_mut().unwrap().v_proj.weight, [2, 30]),
        ("down_proj", |d| &mut d.midlayer.mlp.down_proj.weight, [9, 11]),
        ("lm_head", |d| &mut d.lm_head.weight, [4, 8]),
    ];
    // 2^-17 ≈ 7.6e-6 survives the trip through f32 exactly.
    let eps = (2f64).powi(-17);
    for (name, pick, idx) in picks {
        let mut probe = drafter.clone();
        let g = pick(&mut probe).grad(&grads).expect("gradient present");
        let c = g.dims()[1];
        let analytic = g.into_data().into_vec::<f64>().unwrap()[idx[0] * c + idx[1]];
        let fd = (perturbed(&drafter, &batch, &opts, &pick, idx, eps)
            - perturbed(&drafter, &batch, &opts, &pick, idx, -eps))
            / (2.0 * eps);
        assert!(
            (analytic - fd).abs() <= 1e-6 * analytic.abs().max(fd.abs()).max(1e-3),
            "{name}{idx:?}: analytic {analytic} vs finite difference {fd}"
        );
    }
    // Norm weights (1-D) and the frozen embedding: the embedding gets no gradient.
    let g = drafter.midlayer.hidden_norm.weight.grad(&grads);
    assert!(g.is_some(), "hidden_norm has a gradient");
    assert!(drafter.embed_tokens.grad(&grads).is_none(), "the target embedding is frozen");
}

#[test]
fn checkpoint_tensors_round_trip_through_the_module() {
    let cfg = tiny_config();
    let w = with_embed(&cfg, 8);
    let drafter = Drafter::<B>::from_tensors(&cfg, &w, &Default::default()).unwrap();
    let back = drafter.to_tensors(aerie_model::checkpoint::Dtype::F32);
    for (k, t) in &back {
        assert_eq!(Some(t), w.get(k), "tensor {k} changed through the module");
    }
    assert_eq!(back.len() + 1, w.len(), "everything but the embedding comes back");
    let _ = HostTensor::from_f32(vec![1], &[0.0], aerie_model::checkpoint::Dtype::F32);
}

/// An objective that weights every position's CE and α differently (as the TV and LK losses of
/// aerie-train do), so both per-token tensors carry gradient.
fn token_objective(out: &TttOutput<AD>) -> Tensor<AD, 1> {
    let mut total: Option<Tensor<AD, 1>> = None;
    for (k, s) in out.steps.iter().enumerate() {
        let [b, l] = s.ce_tok.dims();
        let u: Vec<f64> = (0..b * l).map(|i| 0.3 + 0.1 * ((i * 7 + k * 3) % 5) as f64).collect();
        let v: Vec<f64> = (0..b * l).map(|i| -0.5 + 0.2 * ((i * 5 + k) % 7) as f64).collect();
        let w = |x: Vec<f64>| {
            Tensor::<AD, 1>::from_data(TensorData::new(x, [b * l]), (&Default::default(), DType::F64)).reshape([b, l])
        };
        let term = (s.ce_tok.clone() * w(u) + s.alpha_tok.clone() * w(v)).sum();
        total = Some(match total {
            Some(t) => t + term,
            None => term,
        });
    }
    total.unwrap()
}

fn grads_of(drafter: &Drafter<AD>, g: &<AD as burn::tensor::backend::AutodiffBackend>::Gradients) -> Vec<f64> {
    let mut out = Vec::new();
    for p in [
        &drafter.fc.weight,
        &drafter.midlayer.self_attn.gqa().unwrap().q_proj.weight,
        &drafter.midlayer.self_attn.gqa().unwrap().k_proj.weight,
        &drafter.midlayer.mlp.down_proj.weight,
        &drafter.lm_head.weight,
    ] {
        out.extend(p.grad(g).unwrap().into_data().into_vec::<f64>().unwrap());
    }
    out
}

#[test]
fn fused_and_tensor_loss_paths_agree() {
    let _alone = aerie_model::autodiff::exclusive();
    let cfg = tiny_config();
    let w = with_embed(&cfg, 11);
    let seqs: Vec<RefSequence> =
        [9, 6].iter().enumerate().map(|(i, &n)| random_sequence(&cfg, n, 50 + i as u64)).collect();
    let refs: Vec<&RefSequence> = seqs.iter().collect();
    let dev = Default::default();
    let drafter = Drafter::<AD>::from_tensors_as(&cfg, &w, &dev, DType::F64).unwrap();
    let batch = batch::<AD>(&cfg, &w, &refs, &seqs[0], DType::F64, 16);
    let opts = TttOptions::geometric(4, 0.8);
    let run = |path| {
        let out = ttt_forward_with(&drafter, &batch, &opts, path).unwrap();
        let loss = out.loss.clone().into_data().into_vec::<f64>().unwrap()[0];
        let sums: Vec<Vec<f64>> = out
            .steps
            .iter()
            .flat_map(|s| [&s.ce_sum, &s.correct, &s.m_count, &s.pm_count, &s.alpha_sum])
            .map(|t| t.clone().into_data().into_vec::<f64>().unwrap())
            .collect();
        let g_loss = grads_of(&drafter, &out.loss.backward());
        let out = ttt_forward_with(&drafter, &batch, &opts, path).unwrap();
        let g_tok = grads_of(&drafter, &token_objective(&out).backward());
        (loss, sums, g_loss, g_tok)
    };
    let (fused, tensor) = (run(LossPath::Fused), run(LossPath::Tensor));
    assert!(close(fused.0, tensor.0, 1e-12), "loss {} vs {}", fused.0, tensor.0);
    for (i, (a, b)) in fused.1.iter().flatten().zip(tensor.1.iter().flatten()).enumerate() {
        assert!(close(*a, *b, 1e-12), "step sum {i}: fused {a} vs tensor {b}");
    }
    for (what, a, b) in [("loss", &fused.2, &tensor.2), ("token objective", &fused.3, &tensor.3)] {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-10 * scale.max(1e-3), "{what} gradient {i}: fused {x} vs tensor {y}");
        }
    }
    // The per-position hits (0 or pm_k) are the same on both paths, and `correct` is their row
    // sum. A random drafter's argmax meets the teacher's about once in Vd, so they are compared
    // on a bigger batch (forward only) where some do.
    let more: Vec<RefSequence> = [16, 11, 16, 14, 16, 9, 16, 13]
        .iter()
        .enumerate()
        .map(|(i, &n)| random_sequence(&cfg, n, 70 + i as u64))
        .collect();
    let refs: Vec<&RefSequence> = more.iter().collect();
    let big = crate::batch::<AD>(&cfg, &w, &refs, &more[0], DType::F64, 16);
    let l = big.input_ids.dims()[1];
    let hits = |path| {
        let out = ttt_forward_with(&drafter, &big, &opts, path).unwrap();
        let v = |t: &Tensor<AD, 2>| t.clone().into_data().into_vec::<f64>().unwrap();
        let c = |t: &Tensor<AD, 1>| t.clone().into_data().into_vec::<f64>().unwrap();
        out.steps.iter().map(|s| (v(&s.hit_tok), c(&s.correct))).collect::<Vec<_>>()
    };
    let (fused_hits, tensor_hits) = (hits(LossPath::Fused), hits(LossPath::Tensor));
    assert_eq!(fused_hits, tensor_hits, "hit_tok or correct differ between the paths");
    for (k, (hit, correct)) in fused_hits.iter().enumerate() {
        assert!(hit.iter().all(|&h| h == 0.0 || h == 1.0), "step {k}: {hit:?}");
        let rows: Vec<f64> = hit.chunks(l).map(|r| r.iter().sum()).collect();
        assert_eq!(&rows, correct, "step {k}: correct is not the row sum of hit_tok");
    }
    let n = fused_hits.iter().map(|(h, _)| h.iter().filter(|&&x| x > 0.0).count()).sum::<usize>();
    assert!(n >= 3, "{n} hits: the comparison would be nearly vacuous");
}

#[test]
fn alpha_gradients_match_finite_differences() {
    let _alone = aerie_model::autodiff::exclusive();
    let cfg = tiny_config();
    let w = with_embed(&cfg, 12);
    let s = random_sequence(&cfg, 7, 60);
    let dev = Default::default();
    let drafter = Drafter::<AD>::from_tensors_as(&cfg, &w, &dev, DType::F64).unwrap();
    let batch = batch::<AD>(&cfg, &w, &[&s], &s, DType::F64, 16);
    let opts = TttOptions::geometric(3, 0.8);
    let objective = |d: &Drafter<AD>| {
        let out = ttt_forward_with(d, &batch, &opts, LossPath::Fused).unwrap();
        token_objective(&out)
    };
    let grads = objective(&drafter).backward();
    let eps = (2f64).powi(-17);
    type Pick = fn(&mut Drafter<AD>) -> &mut Param<Tensor<AD, 2>>;
    let picks: [(&str, Pick, [usize; 2]); 3] = [
        ("lm_head", |d| &mut d.lm_head.weight, [4, 8]),
        ("q_proj", |d| &mut d.midlayer.self_attn.gqa_mut().unwrap().q_proj.weight, [5, 20]),
        ("fc", |d| &mut d.fc.weight, [3, 17]),
    ];
    for (name, pick, idx) in picks {
        let mut probe = drafter.clone();
        let g = pick(&mut probe).grad(&grads).expect("gradient present");
        let c = g.dims()[1];
        let analytic = g.into_data().into_vec::<f64>().unwrap()[idx[0] * c + idx[1]];
        let at = |delta: f64| {
            let mut d = drafter.clone();
            let p = pick(&mut d);
            let wv = p.val();
            let [r, c] = wv.dims();
            let mut bump = vec![0f64; r * c];
            bump[idx[0] * c + idx[1]] = delta;
            let bump = Tensor::<AD, 1>::from_data(TensorData::new(bump, [r * c]), (&dev, DType::F64)).reshape([r, c]);
            *p = Param::from_tensor((wv + bump).detach());
            objective(&d).into_data().into_vec::<f64>().unwrap()[0]
        };
        let fd = (at(eps) - at(-eps)) / (2.0 * eps);
        assert!(
            (analytic - fd).abs() <= 1e-6 * analytic.abs().max(fd.abs()).max(1e-3),
            "{name}{idx:?}: analytic {analytic} vs finite difference {fd}"
        );
    }
}

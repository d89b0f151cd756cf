//! `eval accept` and `compare` on tiny synthetic captures with hand-computed answers.
//!
//! The "perfect" drafter is built so that every draft equals the target's argmax: the target
//! always predicts token c (its final hidden state is the head row of c, and head rows are unit
//! vectors, so row c wins the dot product), the aux features carry that same row, `fc` passes it
//! through, attention and MLP are switched off (o_proj = down_proj = 0, so every step's output is
//! its input state), and the drafter's lm_head is the target head restricted to the draft ids.

use std::collections::BTreeMap;
use std::path::Path;

use aerie_data::shard::{
    AuxConvention, HiddenDtype, SampleRef, ShardDataset, ShardMetadata, ShardWriter, ShardWriterOptions, Teacher,
};
use aerie_data::vocab::DraftVocab;
use aerie_eval::accept::AcceptRule;
use aerie_eval::compare::{Candidate, write_report};
use aerie_eval::cost::Costs;
use aerie_eval::verify::{AcceptOptions, eval_accept};
use aerie_model::checkpoint::synthetic::{random_drafter, tiny_config};
use aerie_model::checkpoint::{Dtype, HostTensor, TensorMap};
use aerie_model::drafter::shape::{DraftShape, TreeShape};
use aerie_model::{Drafter, DrafterConfig};
use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};

type B = Flex;

/// Unit vectors from splitmix64 (the project's one PRNG).
fn unit_rows(n: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut rng = aerie_model::rng::SplitMix(seed);
    let mut next = || rng.signed_unit();
    let mut out = Vec::with_capacity(n * d);
    for _ in 0..n {
        let row: Vec<f32> = (0..d).map(|_| next()).collect();
        let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        out.extend(row.iter().map(|x| x / norm));
    }
    out
}

struct World {
    cfg: DrafterConfig,
    head: Vec<f32>,
    vocab: DraftVocab,
    base: TensorMap,
    c: usize,
}

fn world() -> World {
    let cfg = tiny_config();
    let base = random_drafter(&cfg, Dtype::F32, 42).tensors;
    let vocab = DraftVocab::from_d2t(&base["d2t"].to_i64("d2t").unwrap(), cfg.vocab_size).unwrap();
    let head = unit_rows(cfg.vocab_size, cfg.target_hidden_size, 7);
    let c = vocab.target_ids()[5];
    World { cfg, head, vocab, base, c }
}

impl World {
    fn row(&self, t: usize) -> &[f32] {
        let ht = self.cfg.target_hidden_size;
        &self.head[t * ht..(t + 1) * ht]
    }

    fn perfect(&self) -> TensorMap {
        let (h, ht, a) = (self.cfg.hidden_size, self.cfg.target_hidden_size, self.cfg.num_aux());
        let mut w = self.base.clone();
        let mut fc = vec![0f32; h * a * ht];
        for i in 0..h {
            fc[i * a * ht + i] = 1.0;
        }
        w.insert("fc.weight".into(), HostTensor::from_f32(vec![h, a * ht], &fc, Dtype::F32));
        for key in ["midlayer.self_attn.o_proj.weight", "midlayer.mlp.down_proj.weight"] {
            let shape = w[key].shape.clone();
            w.insert(key.into(), HostTensor::from_f32(shape.clone(), &vec![0.0; shape.iter().product()], Dtype::F32));
        }
        w.insert("norm.weight".into(), HostTensor::from_f32(vec![h], &vec![1.0; h], Dtype::F32));
        let lm: Vec<f32> = self.vocab.target_ids().iter().flat_map(|&t| self.row(t).to_vec()).collect();
        w.insert(
            "lm_head.weight".into(),
            HostTensor::from_f32(vec![self.vocab.draft_vocab_size(), h], &lm, Dtype::F32),
        );
        w
    }

    fn drafter(&self, w: &TensorMap) -> Drafter<B> {
        Drafter::from_tensors(&self.cfg, w, &Default::default()).unwrap()
    }

    fn head_tensor(&self) -> Tensor<B, 2> {
        let (v, ht) = (self.cfg.vocab_size, self.cfg.target_hidden_size);
        Tensor::from_data(TensorData::new(self.head.clone(), [v, ht]), &Default::default())
    }

    /// Samples of (tokens, mask); the target always predicts c.
    fn capture(&self, dir: &Path, samples: &[(Vec<i32>, Vec<u8>)]) -> ShardDataset {
        let ht = self.cfg.target_hidden_size;
        let meta = ShardMetadata {
            target: "synthetic/tiny-target".into(),
            target_num_layers: 10,
            target_vocab_size: self.cfg.vocab_size,
            aux_layer_ids: vec![1, 4, 6],
            aux_convention: AuxConvention::OutputOfLayer,
            hidden_size: ht,
            dtype: HiddenDtype::F32,
            tokenizer_digest: "0".repeat(64),
            chat_template: "none".into(),
            teacher: Teacher::FinalHidden,
            created_by: "aerie-eval tests".into(),
            extra: BTreeMap::new(),
        };
        let mut w = ShardWriter::create(dir, meta, ShardWriterOptions::default()).unwrap();
        for (ids, mask) in samples {
            let n = ids.len();
            let mut aux = vec![0f32; n * 3 * ht];
            let mut fin = vec![0f32; n * ht];
            for j in 0..n {
                aux[j * 3 * ht..j * 3 * ht + ht].copy_from_slice(self.row(self.c));
                fin[j * ht..(j + 1) * ht].copy_from_slice(self.row(self.c));
            }
            w.push(SampleRef::new(ids, mask, &aux[..]).with_final_hidden(&fin[..])).unwrap();
        }
        w.finish().unwrap();
        ShardDataset::open(dir).unwrap()
    }
}

fn greedy(k: usize) -> AcceptOptions {
    AcceptOptions { shape: DraftShape::Chain { k }, batch_size: 2, ..AcceptOptions::default() }
}

/// 12 tokens, prompt of 3: positions t = 2..=9 count; reach min(3, 10 - t) → Σ = 6·3 + 2 + 1.
fn sample(c: i32, n: usize) -> (Vec<i32>, Vec<u8>) {
    (vec![c; n], (0..n).map(|j| (j >= 3) as u8).collect())
}

#[test]
fn perfect_drafter_accepts_every_verifiable_draft() {
    let w = world();
    let dir = tempfile::tempdir().unwrap();
    let data = w.capture(dir.path(), &[sample(w.c as i32, 12)]);
    let drafter = w.drafter(&w.perfect());
    let head = w.head_tensor();
    let rep = eval_accept(&drafter, &data, Some(&head), &greedy(3), &mut |_, _| {}).unwrap();
    assert_eq!(rep.positions, 8);
    assert_eq!(rep.positions_cut_by_turn_end, 2);
    assert!((rep.tau_all_positions - (1.0 + 21.0 / 8.0)).abs() < 1e-12, "τ = {}", rep.tau_all_positions);
    assert_eq!(rep.accept_rate_unconditional, vec![1.0, 7.0 / 8.0, 6.0 / 8.0]);
    assert_eq!(rep.accept_histogram, vec![0.0, 1.0, 1.0, 6.0]);
    assert_eq!(rep.captured_not_target_argmax, 0.0);
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    // Decoding's cycles over the answer x_3..x_11: the prefill emits x_3; with k = 3 a cycle
    // after x_3 emits x_4..x_7, one after x_7 emits x_8..x_11: 2 cycles, 6 drafts, τ = 4. With
    // k = 1, 4 cycles of 2 tokens (x_4..x_11); with k = 2, cycles after x_3, x_6, x_9: τ = 3.
    let counts: Vec<(u64, u64)> = rep.cycles.iter().map(|c| (c.cycles, c.accepted_drafts)).collect();
    assert_eq!(counts, vec![(4, 4), (3, 6), (2, 6)]);
    assert_eq!(rep.tau, 4.0);
    assert_eq!(rep.curve.iter().map(|p| p.tau).collect::<Vec<_>>(), vec![2.0, 3.0, 4.0]);

    // Uncut: a sample long enough that only chains near its end are cut; τ = K + 1 on the rest.
    let dir2 = tempfile::tempdir().unwrap();
    let long = w.capture(dir2.path(), &[sample(w.c as i32, 40), sample(w.c as i32, 12)]);
    let rep = eval_accept(&drafter, &long, Some(&head), &greedy(3), &mut |_, _| {}).unwrap();
    let full_positions = rep.accept_histogram[3];
    assert_eq!(full_positions as u64, rep.positions - rep.positions_cut_by_turn_end);
    assert_eq!(rep.accept_histogram[0], 0.0);

    // A greedy tree of the perfect drafter keeps the c-c-c chain first: same τ.
    let tree =
        AcceptOptions { shape: DraftShape::Tree(TreeShape { depth: 3, topk: 2, verify_tokens: 4 }), ..greedy(3) };
    let rep_tree = eval_accept(&drafter, &data, Some(&head), &tree, &mut |_, _| {}).unwrap();
    assert!((rep_tree.tau_all_positions - (1.0 + 21.0 / 8.0)).abs() < 1e-12, "tree τ = {}", rep_tree.tau);
    assert_eq!(rep_tree.tau, 4.0);
    assert_eq!(rep_tree.drafting, "tree");
    assert_eq!(rep_tree.curve.len(), 1);
}

/// An answer cut at its budget: the template's end-of-turn token after it is not the target's
/// (its argmax there is c) and is no answer token, neither a position's target nor a cycle's.
#[test]
fn the_end_of_turn_after_a_cut_answer_is_not_predicted() {
    let w = world();
    let dir = tempfile::tempdir().unwrap();
    let (mut ids, mask) = sample(w.c as i32, 12);
    ids[11] = (w.c as i32 + 1) % 512;
    let data = w.capture(dir.path(), &[(ids, mask)]);
    let drafter = w.drafter(&w.perfect());
    let head = w.head_tensor();
    let rep = eval_accept(&drafter, &data, Some(&head), &greedy(3), &mut |_, _| {}).unwrap();
    // The answer is x_3..x_10: positions t = 2..=8, none a mismatch; cycles after x_3 (x_4..x_7)
    // and x_7 (x_8..x_10, the drafts left in the answer).
    assert_eq!(rep.positions, 7);
    assert_eq!(rep.captured_not_target_argmax, 0.0);
    assert_eq!((rep.cycles[2].cycles, rep.cycles[2].accepted_drafts), (2, 6));
    // The same, told the budget: 8 answer tokens.
    let budget = AcceptOptions { answer_budget: Some(8), ..greedy(3) };
    let told = eval_accept(&drafter, &data, Some(&head), &budget, &mut |_, _| {}).unwrap();
    assert_eq!((told.positions, told.cycles.clone()), (rep.positions, rep.cycles.clone()));
    // A tighter budget: 4 answer tokens x_3..x_6, one cycle of 3 drafts.
    let tight = AcceptOptions { answer_budget: Some(4), ..greedy(3) };
    let r = eval_accept(&drafter, &data, Some(&head), &tight, &mut |_, _| {}).unwrap();
    assert_eq!((r.positions, r.cycles[2].cycles, r.cycles[2].accepted_drafts), (3, 1, 3));
}

#[test]
fn random_drafter_is_near_one_and_rules_are_bounded() {
    let w = world();
    let dir = tempfile::tempdir().unwrap();
    let data = w.capture(dir.path(), &[sample(w.c as i32, 12), sample(w.c as i32, 9)]);
    let random = w.drafter(&w.base);
    let head = w.head_tensor();
    let rep = eval_accept(&random, &data, Some(&head), &greedy(3), &mut |_, _| {}).unwrap();
    assert!(rep.tau < 1.3, "a random drafter should almost never hit: τ = {}", rep.tau);
    for rule in [AcceptRule::Sampling, AcceptRule::Onehot] {
        for drafter in [&random, &w.drafter(&w.perfect())] {
            let opts = AcceptOptions { rule, temperature: 1.0, seed: 3, ..greedy(3) };
            let r = eval_accept(drafter, &data, Some(&head), &opts, &mut |_, _| {}).unwrap();
            assert!(r.tau >= 1.0 && r.tau <= 4.0, "{rule:?}: τ = {}", r.tau);
            assert!(r.accept_rate_unconditional.windows(2).all(|p| p[1] <= p[0] + 1e-12));
        }
    }
    // The perfect drafter under one-hot verification: p(c) = softmax(head·row_c)[c] at every step.
    let p = {
        let ht = w.cfg.target_hidden_size;
        let logits: Vec<f64> =
            (0..w.cfg.vocab_size).map(|t| (0..ht).map(|i| (w.row(t)[i] * w.row(w.c)[i]) as f64).sum()).collect();
        let z: f64 = logits.iter().map(|l| l.exp()).sum();
        logits[w.c].exp() / z
    };
    let onehot = AcceptOptions { rule: AcceptRule::Onehot, ..greedy(1) };
    let r = eval_accept(&w.drafter(&w.perfect()), &data, Some(&head), &onehot, &mut |_, _| {}).unwrap();
    assert!((r.accept_rate_unconditional[0] - p).abs() < 1e-5, "{} vs {p}", r.accept_rate_unconditional[0]);
}

#[test]
fn captured_tokens_that_are_not_the_target_argmax_are_flagged() {
    let w = world();
    let dir = tempfile::tempdir().unwrap();
    let (mut ids, mask) = sample(w.c as i32, 12);
    ids[6] = (w.c as i32 + 1) % 512; // x_6 is drafted first at t = 4 only
    let data = w.capture(dir.path(), &[(ids, mask)]);
    let rep = eval_accept(&w.drafter(&w.perfect()), &data, Some(&w.head_tensor()), &greedy(3), &mut |_, _| {}).unwrap();
    assert!((rep.captured_not_target_argmax - 1.0 / 8.0).abs() < 1e-12);
    assert!(rep.warnings.iter().any(|m| m.contains("does not equal decoding τ")), "{:?}", rep.warnings);
}

#[test]
fn invalid_options_are_refused() {
    let bad = AcceptOptions {
        rule: AcceptRule::Sampling,
        temperature: 1.0,
        shape: DraftShape::Tree(TreeShape { depth: 3, topk: 2, verify_tokens: 4 }),
        ..greedy(3)
    };
    assert!(bad.validate().unwrap_err().to_string().contains("greedily"));
    assert!(AcceptOptions { shape: DraftShape::Chain { k: 0 }, ..greedy(3) }.validate().is_err());
    let argmax_sampling = AcceptOptions { rule: AcceptRule::Sampling, ..greedy(3) };
    assert!(argmax_sampling.validate().unwrap_err().to_string().contains("onehot"));
}

#[test]
fn compare_writes_every_file() {
    let w = world();
    let dir = tempfile::tempdir().unwrap();
    let data = w.capture(dir.path().join("data").as_path(), &[sample(w.c as i32, 12)]);
    let head = w.head_tensor();
    let costs =
        Costs::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/costs/kimi-k25-8x-rtx-pro-6000.toml"))
            .unwrap();
    let mut cands = Vec::new();
    for (name, weights) in [("perfect", w.perfect()), ("random", w.base.clone())] {
        let rep = eval_accept(&w.drafter(&weights), &data, Some(&head), &greedy(3), &mut |_, _| {}).unwrap();
        cands.push(Candidate::new(name.into(), name.into(), rep, Some(&costs)));
    }
    let out = dir.path().join("report");
    let written = write_report(&out, &cands, Some(&costs)).unwrap();
    for f in [
        "compare.md",
        "compare.csv",
        "compare.parquet",
        "compare.json",
        "acceptance.png",
        "acceptance.svg",
        "speedup.png",
        "speedup.svg",
    ] {
        let p = out.join(f);
        assert!(written.contains(&p), "{f} not reported");
        assert!(std::fs::metadata(&p).unwrap().len() > 100, "{f} is empty");
    }
    assert_eq!(&std::fs::read(out.join("acceptance.png")).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    assert!(std::fs::read_to_string(out.join("speedup.svg")).unwrap().contains("<svg"));
    assert_eq!(&std::fs::read(out.join("compare.parquet")).unwrap()[..4], b"PAR1");
    let csv = std::fs::read_to_string(out.join("compare.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3);
    assert!(csv.starts_with("drafter,tau,alpha_conditional_1"));
    let md = std::fs::read_to_string(out.join("compare.md")).unwrap();
    // τ is the cycle walk's (the perfect drafter's 2 cycles of 4 tokens), not every position's 3.625.
    assert!(md.contains("| perfect | 4.000 |"), "{md}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("compare.json")).unwrap()).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), 2);
    // Kimi costs at τ(2) = 3 (the walk's 3 cycles of 2 accepted drafts) with the measured 29 ms
    // cycle: S = 3·12.1/29.
    let best = &json["candidates"][0]["projection"]["rows"];
    let k2 = best.as_array().unwrap().iter().find(|r| r["k"] == 2).unwrap();
    assert!((k2["speedup"].as_f64().unwrap() - 3.0 * 12.1 / 29.0).abs() < 1e-9);
    if let Ok(keep) = std::env::var("AERIE_KEEP_REPORT") {
        let keep = Path::new(&keep);
        std::fs::create_dir_all(keep).unwrap();
        for f in ["acceptance.png", "speedup.png", "compare.md"] {
            std::fs::copy(out.join(f), keep.join(f)).unwrap();
        }
    }
}

/// A NaN in a shard's `aux_hidden` fails every evaluation over it (accept, loss) with an error
/// naming the shard and the sample, where `eval loss` used to print `"loss": null` and exit 0.
#[test]
fn a_nan_in_the_shards_fails_evaluations_naming_shard_and_sample() {
    let w = world();
    let dir = tempfile::tempdir().unwrap();
    drop(w.capture(dir.path(), &[sample(w.c as i32, 12), sample(w.c as i32, 9)]));
    // Poison value [4, 2] of the second sample (tokens 12..21 of the shard) in place.
    let shard = dir.path().join("shard-00000.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let start = header["aux_hidden"]["data_offsets"][0].as_u64().unwrap() as usize;
    let width = 3 * w.cfg.target_hidden_size;
    let at = 8 + n + start + 4 * ((12 + 4) * width + 2);
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&shard, bytes).unwrap();

    let data = ShardDataset::open(dir.path()).unwrap();
    let drafter = w.drafter(&w.perfect());
    let head = w.head_tensor();
    let needle = "shard-00000.safetensors: sample 1: aux_hidden[4, 2] = NaN is not finite";
    let e = eval_accept(&drafter, &data, Some(&head), &greedy(3), &mut |_, _| {}).unwrap_err().to_string();
    assert!(e.contains(needle), "{e}");
    let target_head = aerie_model::teacher::TargetHead::new(head, drafter.vocab(), 64);
    let opts = aerie_model::ttt::eval::EvalLossOptions::default();
    let e = aerie_model::ttt::eval::eval_loss(&drafter, &data, Some(&target_head), &opts, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains(needle), "{e}");
}

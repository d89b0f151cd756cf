//! Real speculative decoding ([`aerie_eval::decode`]) on a tiny random target with a drafter
//! whose draft vocabulary holds the tokens the target likes to emit, so that drafts do get
//! accepted: greedy speculative output must equal plain greedy output token for token, for
//! chains and trees, and sampling must run to the end with every emitted token in range.

#[path = "../../aerie-capture/tests/fixture/mod.rs"]
mod fixture;

use std::collections::BTreeMap;

use aerie_data::conversation::{Message, Role};
use aerie_data::generation::PromptEncoder;
use aerie_data::template::TemplateChoice;
use aerie_eval::accept::AcceptRule;
use aerie_eval::decode::{DecodeOptions, DecodeTimings, SpecDecoder};
use aerie_model::checkpoint::synthetic::{random_drafter, tiny_config};
use aerie_model::checkpoint::validate::derive_t2d;
use aerie_model::checkpoint::{Dtype, HostTensor, keys};
use aerie_model::drafter::shape::{DraftShape, TreeShape};
use aerie_model::{AuxConvention, AuxLayers, Drafter, TargetModel};
use burn::backend::Flex;

type B = Flex;

struct Setup {
    _dir: tempfile::TempDir,
    target: TargetModel<B>,
    drafter: Drafter<B>,
    prompts: Vec<Vec<u32>>,
    stop: Vec<u32>,
}

fn setup(draft_vocab: usize) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let tdir = dir.path().join("target");
    fixture::write_target(&tdir, 32, 4, 21);
    let target = TargetModel::<B>::load(&tdir, &Default::default()).unwrap();
    let enc = PromptEncoder::load(&tdir, &TemplateChoice::Auto).unwrap();
    let stop = enc.stop_ids(&target.spec().eos_token_ids);
    let prompts: Vec<Vec<u32>> = ["Why is the sky blue?", "Name three primes.", "hi"]
        .iter()
        .map(|p| enc.encode(&[Message::new(Role::User, *p)]).unwrap())
        .collect();
    // The draft vocabulary: the tokens plain greedy decoding emits most.
    let mut freq: BTreeMap<u32, usize> = BTreeMap::new();
    for p in &prompts {
        for t in target.generate(p, 48, &stop).unwrap() {
            *freq.entry(t).or_default() += 1;
        }
    }
    let mut by_freq: Vec<(u32, usize)> = freq.into_iter().collect();
    by_freq.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut chosen: Vec<u32> = by_freq.iter().map(|&(t, _)| t).take(draft_vocab).collect();
    for t in 0..fixture::VOCAB as u32 {
        if chosen.len() >= draft_vocab {
            break;
        }
        if !chosen.contains(&t) {
            chosen.push(t);
        }
    }
    chosen.sort_unstable();

    let mut cfg = tiny_config();
    cfg.hidden_size = 32;
    cfg.target_hidden_size = 32;
    cfg.intermediate_size = 48;
    cfg.head_dim = 8;
    cfg.vocab_size = fixture::VOCAB;
    cfg.draft_vocab_size = draft_vocab;
    cfg.aux_layers = AuxLayers { ids: vec![0, 1, 2], convention: AuxConvention::OutputOfLayer };
    let mut ckpt = random_drafter(&cfg, Dtype::F32, 5);
    let d2t: Vec<i64> = chosen.iter().enumerate().map(|(i, &t)| t as i64 - i as i64).collect();
    let t2d = derive_t2d(&d2t, cfg.vocab_size);
    ckpt.tensors.insert(keys::D2T.into(), HostTensor::from_i64(vec![d2t.len()], &d2t));
    ckpt.tensors.insert(keys::T2D.into(), HostTensor::from_bool(vec![t2d.len()], &t2d));
    let emb: Vec<f32> = target.model.embed_tokens.weight.val().into_data().iter::<f32>().collect();
    ckpt.tensors.insert(keys::EMBED.into(), HostTensor::from_f32(vec![cfg.vocab_size, 32], &emb, Dtype::F32));
    let drafter = Drafter::<B>::from_tensors(&cfg, &ckpt.tensors, &Default::default()).unwrap();
    Setup { _dir: dir, target, drafter, prompts, stop }
}

fn greedy(shape: DraftShape) -> DecodeOptions {
    DecodeOptions { shape, temperature: 0.0, rule: AcceptRule::Greedy, max_new_tokens: 40, seed: 0 }
}

#[test]
fn greedy_speculative_output_is_plain_greedy_output() {
    let s = setup(4);
    let dec = SpecDecoder::new(&s.target, &s.drafter, s.stop.clone()).unwrap();
    let shapes = [
        DraftShape::Chain { k: 1 },
        DraftShape::Chain { k: 4 },
        DraftShape::Tree(TreeShape { depth: 3, topk: 2, verify_tokens: 6 }),
        DraftShape::Tree(TreeShape { depth: 4, topk: 3, verify_tokens: 10 }),
    ];
    for shape in shapes {
        let opts = greedy(shape);
        let mut timings = DecodeTimings::default();
        let mut accepted = 0;
        for p in &s.prompts {
            let plain = dec.plain(p, &opts, &mut timings).unwrap();
            let spec = dec.speculative(p, &opts, &mut timings).unwrap();
            assert_eq!(spec.tokens, plain.tokens, "{shape:?}");
            assert_eq!(spec.emitted.iter().sum::<usize>() + 1, spec.tokens.len());
            assert!(spec.accepted.iter().all(|&a| a <= shape.depth()));
            accepted += spec.accepted.iter().sum::<usize>();
        }
        assert!(accepted > 0, "{shape:?}: no draft was ever accepted; the test would not test acceptance");
        let costs = timings.costs("tiny", &shape, "test", "now").unwrap();
        costs.validate().unwrap();
        assert!(costs.t_d_ms > 0.0 && costs.t_s_ms.unwrap() > 0.0);
        assert!(costs.t_v.unwrap().table.contains_key(&shape.verify_tokens().to_string()));
    }
}

#[test]
fn sampling_runs_are_seeded_and_in_range() {
    let s = setup(4);
    let dec = SpecDecoder::new(&s.target, &s.drafter, s.stop.clone()).unwrap();
    for (shape, rule) in [
        (DraftShape::Chain { k: 3 }, AcceptRule::Sampling),
        (DraftShape::Chain { k: 3 }, AcceptRule::Onehot),
        (DraftShape::Tree(TreeShape { depth: 3, topk: 2, verify_tokens: 6 }), AcceptRule::Onehot),
    ] {
        let opts = DecodeOptions { shape, temperature: 0.8, rule, max_new_tokens: 30, seed: 9 };
        let mut t = DecodeTimings::default();
        let a = dec.speculative(&s.prompts[0], &opts, &mut t).unwrap();
        let b = dec.speculative(&s.prompts[0], &opts, &mut t).unwrap();
        assert_eq!((&a.tokens, &a.accepted), (&b.tokens, &b.accepted), "{shape:?} {rule:?}: same seed, same answer");
        assert!(a.tokens.len() <= 30 && a.tokens.iter().all(|&x| (x as usize) < fixture::VOCAB));
    }
    // Options without a lossless meaning are refused.
    let bad = DecodeOptions { temperature: 0.5, ..greedy(DraftShape::Chain { k: 2 }) };
    assert!(dec.speculative(&s.prompts[0], &bad, &mut DecodeTimings::default()).is_err());
    let bad = DecodeOptions {
        rule: AcceptRule::Sampling,
        temperature: 1.0,
        ..greedy(DraftShape::Tree(TreeShape { depth: 2, topk: 2, verify_tokens: 4 }))
    };
    assert!(dec.speculative(&s.prompts[0], &bad, &mut DecodeTimings::default()).is_err());
}

//! Draft vocabularies: the §4 invariants, frequency order with ties and padding, the
//! safetensors file, and keeping an existing drafter's mapping.

use std::collections::HashMap;

use aerie_data::prepare::{PrepareOptions, prepare};
use aerie_data::template::{BuiltinTemplate, TemplateChoice};
use aerie_data::vocab::{DraftVocab, TokenCounts, VocabOptions, build_vocab};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use super::common::{sharegpt_record, special_id, tempdir, tokenizer_dir, vocab_size};

/// The eagle3.md §4 invariants, checked on the tensors as written.
fn check_invariants(path: &std::path::Path, vd: usize, v: usize) -> Vec<i64> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let d2t = st.tensor("d2t").unwrap();
    let t2d = st.tensor("t2d").unwrap();
    assert_eq!((d2t.dtype(), d2t.shape()), (Dtype::I64, &[vd][..]));
    assert_eq!((t2d.dtype(), t2d.shape()), (Dtype::BOOL, &[v][..]));
    let d2t: Vec<i64> = d2t.data().chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    let t2d: Vec<bool> = t2d.data().iter().map(|&b| b != 0).collect();
    assert_eq!(t2d.iter().filter(|&&b| b).count(), vd, "t2d.sum() == Vd");
    let targets: Vec<i64> = d2t.iter().enumerate().map(|(i, &o)| i as i64 + o).collect();
    assert!(targets.iter().all(|&t| (0..v as i64).contains(&t)), "0 <= i + d2t[i] < V");
    let nonzero: Vec<i64> = (0..v as i64).filter(|&t| t2d[t as usize]).collect();
    assert_eq!(nonzero, targets, "nonzero(t2d) == d2t + arange(Vd)");
    targets
}

#[test]
fn build_orders_by_frequency_breaks_ties_by_id_and_pads() {
    let mut counts = TokenCounts::new(10);
    // 7 ×3, 2 ×2, 5 ×2, 9 ×1 under the mask; 4 unmasked.
    counts.add(&[7, 7, 7, 2, 5, 4, 2, 5, 9], &[1, 1, 1, 1, 1, 0, 1, 1, 1]).unwrap();
    assert_eq!(counts.masked_tokens, 8);
    assert_eq!(counts.distinct(), 4);
    assert_eq!(counts.add(&[10], &[1]), Err(10));
    let v = DraftVocab::build(&counts, 2).unwrap();
    assert_eq!(v.target_ids(), [2, 7], "ties (2 and 5, twice each) go to the lower id");
    assert_eq!(v.d2t(), [2, 6]);
    assert!((v.coverage(&counts) - 5.0 / 8.0).abs() < 1e-12);
    let v = DraftVocab::build(&counts, 6).unwrap();
    assert_eq!(v.target_ids(), [0, 1, 2, 5, 7, 9], "padded with the lowest unused ids");
    assert_eq!(v.coverage(&counts), 1.0);
    assert!(DraftVocab::build(&counts, 11).is_err());
    assert!(DraftVocab::build(&counts, 0).is_err());
    // Invalid mappings are refused.
    assert!(DraftVocab::from_d2t(&[0, 0, -1], 10).is_err(), "not ascending");
    assert!(DraftVocab::from_d2t(&[0, 9], 10).is_err(), "out of range");
    assert!(DraftVocab::from_d2t(&[-1], 10).is_err(), "negative target");
}

fn prepared(dir: &std::path::Path) -> std::path::PathBuf {
    let data = dir.join("d.json");
    let recs: Vec<String> = (0..30)
        .map(|i| sharegpt_record(&format!("c{i}"), &[("human", "hello"), ("gpt", &format!("the answer is {}", i % 7))]))
        .collect();
    std::fs::write(&data, format!("[{}]", recs.join(","))).unwrap();
    let tok = tokenizer_dir(dir, None, None);
    let out = dir.join("prepared");
    let mut opts = PrepareOptions::new(&data, &tok, &out);
    opts.template = TemplateChoice::Builtin(BuiltinTemplate::ChatMl);
    prepare(&opts, &mut |_| {}).unwrap();
    out
}

#[test]
fn vocab_build_writes_a_valid_mapping_and_a_report() {
    let dir = tempdir();
    let ds = prepared(dir.path());
    let out = dir.path().join("vocab.safetensors");
    let v = vocab_size();
    let opts = VocabOptions { draft_vocab_size: Some(64), ..VocabOptions::default() };
    let report = build_vocab(&ds, &out, &opts, &mut |_, _| {}).unwrap();
    assert_eq!((report.vocab_size, report.draft_vocab_size, report.source.as_str()), (v, 64, "built"));
    assert_eq!(report.samples, 30);
    assert!(report.distinct_tokens < 64);
    assert_eq!(report.coverage, 1.0, "fewer distinct ids than Vd: everything is covered");
    assert_eq!(report.padded_ids, 64 - report.distinct_tokens);
    let targets = check_invariants(&out, 64, v);
    // The end-of-turn token is trained on, so it is in the draft vocabulary.
    assert!(targets.contains(&i64::from(special_id("<|im_end|>"))), "<|im_end|> is masked");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("vocab.json")).unwrap()).unwrap();
    assert_eq!(json["coverage"], 1.0);
    let bytes = std::fs::read(&out).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    assert_eq!(meta["format"], "aerie-vocab/1");
    assert_eq!(meta["masked_tokens"], report.masked_tokens.to_string());

    // A small Vd covers only part of the masked tokens; the read-back mapping is the same.
    let small =
        build_vocab(&ds, &out, &VocabOptions { draft_vocab_size: Some(4), ..VocabOptions::default() }, &mut |_, _| {})
            .unwrap();
    assert!(small.coverage < 1.0 && small.coverage > 0.0);
    let back = DraftVocab::read(&out, None).unwrap();
    assert_eq!(back.target_ids().len(), 4);
    assert_eq!(back.vocab_size(), v);
    assert!(build_vocab(&ds, &out, &VocabOptions::default(), &mut |_, _| {}).is_err(), "Vd is required");
    let err = build_vocab(&ds, &dir.path().join("v.json"), &opts, &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("safetensors"), "{err}");
}

/// `mix`: a second domain's dataset (same tokenizer) counted as much as the first, each one's
/// coverage reported; refused with `keep_from` and for another tokenizer's data.
#[test]
fn a_mixed_vocabulary_covers_both_domains() {
    let dir = tempdir();
    let chat = prepared(dir.path());
    let code_dir = dir.path().join("code");
    std::fs::create_dir_all(&code_dir).unwrap();
    let data = code_dir.join("d.json");
    let recs: Vec<String> = (0..3)
        .map(|i| sharegpt_record(&format!("k{i}"), &[("human", "write code"), ("gpt", "def f(x): return x * 2")]))
        .collect();
    std::fs::write(&data, format!("[{}]", recs.join(","))).unwrap();
    let tok = tokenizer_dir(dir.path(), None, None);
    let code = code_dir.join("prepared");
    let mut opts = PrepareOptions::new(&data, &tok, &code);
    opts.template = TemplateChoice::Builtin(BuiltinTemplate::ChatMl);
    prepare(&opts, &mut |_| {}).unwrap();

    let vd = 12;
    let out = dir.path().join("chat.safetensors");
    let only_chat = build_vocab(
        &chat,
        &out,
        &VocabOptions { draft_vocab_size: Some(vd), ..VocabOptions::default() },
        &mut |_, _| {},
    )
    .unwrap();
    let mixed_out = dir.path().join("mixed.safetensors");
    let opts = VocabOptions { draft_vocab_size: Some(vd), mix: vec![code.clone()], ..VocabOptions::default() };
    let mixed = build_vocab(&chat, &mixed_out, &opts, &mut |_, _| {}).unwrap();
    check_invariants(&mixed_out, vd, vocab_size());
    assert_eq!(mixed.datasets.len(), 2);
    assert_eq!((&mixed.datasets[0].prepared, &mixed.datasets[1].prepared), (&chat, &code));
    // The code answers' ids were rare in the chat-only map (3 samples against 30) and are in the
    // mixed one; the chat data keeps most of its coverage.
    let chat_only = DraftVocab::read(&out, None).unwrap();
    let code_counts = {
        let ds = aerie_data::prepare::PreparedDataset::open(&code).unwrap();
        aerie_data::vocab::count_masked_tokens(&ds, &["train".into()], vocab_size(), &mut |_, _| {}).unwrap()
    };
    assert!(mixed.datasets[1].coverage > chat_only.coverage(&code_counts), "{mixed:?}");
    assert!(mixed.datasets[0].coverage <= only_chat.coverage);
    assert!(mixed.datasets[0].coverage > 0.5, "{mixed:?}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("mixed.json")).unwrap()).unwrap();
    assert_eq!(json["datasets"].as_array().unwrap().len(), 2);

    let both = VocabOptions { keep_from: Some(dir.path().join("x")), ..opts.clone() };
    let err = build_vocab(&chat, &mixed_out, &both, &mut |_, _| {}).unwrap_err().to_string();
    assert!(err.contains("--mix or --keep-from"), "{err}");
    // Another tokenizer's data (its recorded digest changed, as another tokenizer.json gives).
    let report = code.join("report.json");
    let mut r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    r["tokenizer_digest"] = serde_json::json!("0".repeat(64));
    std::fs::write(&report, serde_json::to_vec(&r).unwrap()).unwrap();
    let err = build_vocab(&chat, &mixed_out, &opts, &mut |_, _| {}).unwrap_err().to_string();
    assert!(err.contains("another tokenizer") && err.contains(&code.display().to_string()), "{err}");
}

/// A drafter checkpoint with some weights and the given mapping.
fn write_drafter(dir: &std::path::Path, target_ids: &[i64], v: usize) -> std::path::PathBuf {
    let drafter = dir.join("drafter");
    std::fs::create_dir_all(&drafter).unwrap();
    let d2t: Vec<u8> = target_ids.iter().enumerate().flat_map(|(i, &t)| (t - i as i64).to_le_bytes()).collect();
    let mut t2d = vec![0u8; v];
    for &t in target_ids {
        t2d[t as usize] = 1;
    }
    let w = vec![0u8; 4 * 8];
    let tensors = vec![
        ("fc.weight", TensorView::new(Dtype::F32, vec![2, 4], &w).unwrap()),
        ("d2t", TensorView::new(Dtype::I64, vec![target_ids.len()], &d2t).unwrap()),
        ("t2d", TensorView::new(Dtype::BOOL, vec![v], &t2d).unwrap()),
    ];
    std::fs::write(
        drafter.join("model.safetensors"),
        safetensors::serialize(tensors, None::<HashMap<String, String>>).unwrap(),
    )
    .unwrap();
    drafter
}

#[test]
fn keep_from_reuses_the_drafters_mapping_and_reports_its_coverage() {
    let dir = tempdir();
    let ds = prepared(dir.path());
    let v = vocab_size();
    let kept_ids: Vec<i64> = (0..16).collect(); // control bytes: almost nothing the data uses
    let drafter = write_drafter(dir.path(), &kept_ids, v);
    let out = dir.path().join("vocab.safetensors");
    let opts = VocabOptions { keep_from: Some(drafter.clone()), ..VocabOptions::default() };
    let report = build_vocab(&ds, &out, &opts, &mut |_, _| {}).unwrap();
    assert_eq!(report.source, "kept");
    assert_eq!(report.draft_vocab_size, 16);
    let targets = check_invariants(&out, 16, v);
    assert_eq!(targets, kept_ids, "the drafter's mapping is kept, never rebuilt");
    assert!(report.coverage < 0.05, "{}", report.coverage);
    assert!(report.rebuilt_coverage.unwrap() > report.coverage);

    // A different Vd is refused rather than silently replacing the mapping.
    let err = build_vocab(&ds, &out, &VocabOptions { draft_vocab_size: Some(32), ..opts.clone() }, &mut |_, _| {})
        .unwrap_err();
    assert!(err.to_string().contains("must keep its mapping"), "{err}");
    // A drafter whose t2d disagrees with its d2t, or with the data's V, is refused.
    let bad = write_drafter(&dir.path().join("bad"), &[3, 1], v);
    let err = build_vocab(&ds, &out, &VocabOptions { keep_from: Some(bad), ..VocabOptions::default() }, &mut |_, _| {})
        .unwrap_err();
    assert!(err.to_string().contains("not strictly ascending"), "{err}");
    let wrong_v = write_drafter(&dir.path().join("wrong-v"), &[1, 2], v + 5);
    let err =
        build_vocab(&ds, &out, &VocabOptions { keep_from: Some(wrong_v), ..VocabOptions::default() }, &mut |_, _| {})
            .unwrap_err();
    assert!(err.to_string().contains("target vocabulary"), "{err}");
}

//! `prepare` end to end: ShareGPT JSON in, parquet splits and report.json out, read back with
//! `PreparedDataset`; deterministic splits; refusal to overwrite; no temp files left behind.

use aerie_data::conversation::{DropReason, TrimReason};
use aerie_data::prepare::{EVAL, PrepareOptions, PreparedDataset, TRAIN, prepare, split_of};
use aerie_data::template::{BuiltinTemplate, TemplateChoice};

use super::common::{SMOLLM2_TEMPLATE, sharegpt_record, tempdir, tokenizer_dir, vocab_size};

/// 40 good conversations plus one of each kind of bad one, cut mid-record at the end.
fn write_sharegpt(path: &std::path::Path) -> usize {
    let mut recs: Vec<String> = (0..40)
        .map(|i| {
            sharegpt_record(
                &format!("conv-{i}"),
                &[
                    ("human", &format!("question {i}?")),
                    ("gpt", &format!("answer {i}.")),
                    ("human", "more"),
                    ("chatgpt", "the end"),
                ],
            )
        })
        .collect();
    recs.push(sharegpt_record("no-answer", &[("human", "hello?")]));
    recs.push(sharegpt_record("alien", &[("human", "hi"), ("alien", "boo"), ("gpt", "x")]));
    recs.push(sharegpt_record("empty", &[("human", "hi"), ("gpt", "")]));
    recs.push(sharegpt_record("lead", &[("gpt", "I start"), ("human", "hi"), ("gpt", "ok")]));
    recs.push(r#"{"id": "bad", "conversations": "nope"}"#.into());
    let text = format!("[{}, {}", recs.join(", "), &sharegpt_record("cut", &[("human", "x"), ("gpt", "y")])[..20]);
    std::fs::write(path, text).unwrap();
    recs.len()
}

#[test]
fn prepare_writes_splits_and_a_report_that_read_back() {
    let dir = tempdir();
    let data = dir.path().join("sharegpt.json");
    write_sharegpt(&data);
    let tok = tokenizer_dir(dir.path(), Some(SMOLLM2_TEMPLATE), Some(1000));
    let out = dir.path().join("prepared");
    let mut opts = PrepareOptions::new(&data, &tok, &out);
    opts.eval_fraction = 0.25;
    let mut calls = 0;
    let report = prepare(&opts, &mut |_| calls += 1).unwrap();
    assert!(calls >= 1);

    let c = &report.conversations;
    assert_eq!(report.read.records, 44);
    assert_eq!(report.read.malformed, 1);
    assert!(report.read.truncated.is_some());
    assert_eq!(c.conversations, 45);
    assert_eq!(c.kept, 41);
    assert_eq!(c.dropped[&DropReason::NoAssistantTurn], 1);
    assert_eq!(c.dropped[&DropReason::UnknownRole], 1);
    assert_eq!(c.dropped[&DropReason::EmptyContent], 1);
    assert_eq!(c.dropped[&DropReason::Malformed], 1);
    assert_eq!(c.trimmed[&TrimReason::LeadingNonUser], 1);
    assert_eq!(c.source_roles["chatgpt"], 40);
    assert_eq!(report.vocab_size, 1000, "config.json's vocab_size wins over the tokenizer's");
    assert_eq!(report.samples, 41);
    assert_eq!(report.template, tok.join("tokenizer_config.json").display().to_string());
    let (train, eval) = (&report.splits[TRAIN], &report.splits[EVAL]);
    assert_eq!(train.samples + eval.samples, 41);
    assert!(eval.samples > 0 && train.samples > eval.samples);
    assert_eq!(report.tokens, train.tokens + eval.tokens);
    assert_eq!(report.length_histogram.iter().map(|b| b.samples).sum::<u64>(), 41);

    // Files: the splits, the report, nothing temporary.
    let mut names: Vec<_> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["eval.parquet", "report.json", "train.parquet"]);

    let ds = PreparedDataset::open(&out).unwrap();
    assert_eq!(ds.report(), &report);
    assert_eq!(ds.splits(), [EVAL, TRAIN]);
    let mut seen = 0;
    let mut masked = 0;
    for split in [TRAIN, EVAL] {
        for s in ds.samples(split).unwrap() {
            let s = s.unwrap();
            assert_eq!(split_of(&s.source_id, 0.25), split);
            assert_eq!(s.input_ids.len(), s.loss_mask.len());
            assert!(s.input_ids.iter().all(|&i| (i as usize) < vocab_size()));
            masked += s.loss_mask.iter().filter(|&&m| m == 1).count() as u64;
            if s.source_id == "conv-3" {
                assert_eq!(s.sample_id, 3);
            }
            seen += 1;
        }
        assert_eq!(ds.len(split), report.splits[split].samples);
    }
    assert_eq!(seen, 41);
    assert_eq!(masked, report.masked_tokens);

    // The same run again is refused, then allowed with overwrite, and gives the same data.
    let err = prepare(&opts, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("already holds a prepared dataset"), "{err}");
    opts.overwrite = true;
    let again = prepare(&opts, &mut |_| {}).unwrap();
    assert_eq!(again, report);
    // Without an eval split, a stale eval.parquet goes away.
    opts.eval_fraction = 0.0;
    opts.max_samples = Some(5);
    opts.template = TemplateChoice::Builtin(BuiltinTemplate::ChatMl);
    let small = prepare(&opts, &mut |_| {}).unwrap();
    assert_eq!(small.samples, 5);
    assert!(!out.join("eval.parquet").exists());
    assert_eq!(PreparedDataset::open(&out).unwrap().splits(), [TRAIN]);
}

#[test]
fn strict_mode_and_nothing_kept_are_errors_that_leave_no_files() {
    let dir = tempdir();
    let data = dir.path().join("sharegpt.json");
    write_sharegpt(&data);
    let tok = tokenizer_dir(dir.path(), None, None);
    let out = dir.path().join("prepared");
    let mut opts = PrepareOptions::new(&data, &tok, &out);
    opts.template = TemplateChoice::Builtin(BuiltinTemplate::ChatMl);
    opts.read.strict = true;
    let err = prepare(&opts, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("sharegpt.json") && err.contains("malformed"), "{err}");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);

    opts.read.strict = false;
    opts.encode.max_length = Some(3);
    let err = prepare(&opts, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("no sample kept") && err.contains("no_masked_tokens"), "{err}");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);

    opts.encode.max_length = Some(16);
    opts.eval_fraction = 1.5;
    assert!(prepare(&opts, &mut |_| {}).unwrap_err().to_string().contains("eval fraction"));
}

#[test]
fn splits_are_a_pure_function_of_the_source_id() {
    let n = 10_000;
    let eval = (0..n).filter(|i| split_of(&format!("id-{i}"), 0.02) == EVAL).count();
    assert!((150..250).contains(&eval), "{eval} of {n} in eval at 2%");
    assert_eq!(split_of("x", 0.0), TRAIN);
    assert_eq!(split_of("abc", 0.3), split_of("abc", 0.3));
}

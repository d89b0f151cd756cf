//! The real ShareGPT V3 file (assets.md): truncated at 125,509,632 bytes, 17,671 complete
//! conversations before the cut. Runs only with `AERIE_TEST_ASSETS=1` and the file present at
//! `$AERIE_SHAREGPT`, else where `aerie assets fetch sharegpt` puts it
//! (`$AERIE_HOME/assets/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json`, `AERIE_HOME`
//! defaulting to `~/.cache/aerie`).

use std::path::PathBuf;

use aerie_data::conversation::{NormalizeOptions, NormalizeReport, normalize};
use aerie_data::readers::{ConversationReader, InputFormat, ReadOptions};

fn sharegpt_path() -> Option<PathBuf> {
    if std::env::var("AERIE_TEST_ASSETS").as_deref() != Ok("1") {
        return None;
    }
    let path = std::env::var_os("AERIE_SHAREGPT").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("AERIE_HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::home_dir().map(|h| h.join(".cache").join("aerie")))
            .unwrap_or_else(|| std::env::temp_dir().join("aerie"));
        home.join("assets/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json")
    });
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipping: {} not found", path.display());
        None
    }
}

#[test]
fn real_assets_sharegpt_salvages_every_complete_conversation() {
    let Some(path) = sharegpt_path() else {
        eprintln!("skipping: set AERIE_TEST_ASSETS=1 (and AERIE_SHAREGPT) to read the real ShareGPT file");
        return;
    };
    let mut reader =
        ConversationReader::open(&path, &ReadOptions { format: InputFormat::Auto, strict: false }).unwrap();
    let mut norm = NormalizeReport::default();
    for raw in reader.by_ref() {
        let raw = raw.unwrap();
        norm.count_roles(&raw);
        match normalize(raw, &NormalizeOptions::default()) {
            Ok(n) => norm.keep(&n.trims),
            Err(r) => norm.drop(r),
        }
    }
    let report = reader.into_report();
    assert_eq!(report.format, InputFormat::JsonArray);
    assert_eq!(report.records + report.malformed, 17_671);
    let cut = report.truncated.expect("the file is cut mid-record");
    assert_eq!(cut.complete_records, 17_671);
    assert!(cut.byte_offset < 125_509_632);
    // Role counts over the complete records (assets.md).
    let roles = &norm.source_roles;
    assert_eq!(roles["human"], 61_420);
    assert_eq!(roles["gpt"], 67_594);
    assert_eq!(roles["system"], 41);
    assert_eq!(roles["chatgpt"], 8);
    assert_eq!(roles["bing"], 4);
    assert_eq!(roles["bard"], 2);
    assert_eq!(roles["user"], 2);
    eprintln!("{}", serde_json::to_string_pretty(&norm).unwrap());
}

/// `aerie data prepare` on the real file with a real tokenizer directory (`$AERIE_TOKENIZER`,
/// e.g. SmolLM2-135M-Instruct's `tokenizer.json` + `tokenizer_config.json` with its chat
/// template): every masked run must end with the template's end-of-turn token, and the run
/// reports its throughput. `$AERIE_PREPARE_MAX` caps the samples (default 2000; 0 = all).
#[test]
fn real_assets_prepare_sharegpt_with_a_real_tokenizer() {
    let Some(path) = sharegpt_path() else {
        eprintln!("skipping: set AERIE_TEST_ASSETS=1 (and AERIE_SHAREGPT) to read the real ShareGPT file");
        return;
    };
    let Some(tok_dir) = std::env::var_os("AERIE_TOKENIZER").map(PathBuf::from) else {
        eprintln!("skipping: set AERIE_TOKENIZER to a tokenizer directory");
        return;
    };
    let max: u64 = std::env::var("AERIE_PREPARE_MAX").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let out = tempfile::Builder::new().prefix("aerie-real-prepare-").tempdir().unwrap();
    let mut opts = aerie_data::prepare::PrepareOptions::new(&path, &tok_dir, out.path());
    opts.eval_fraction = 0.02;
    opts.max_samples = (max > 0).then_some(max);
    let start = std::time::Instant::now();
    let report = aerie_data::prepare::prepare(&opts, &mut |_| {}).unwrap();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "prepared {} samples, {} tokens ({} masked) in {secs:.1}s: {:.0} samples/s, {:.0} tokens/s",
        report.samples,
        report.tokens,
        report.masked_tokens,
        report.samples as f64 / secs,
        report.tokens as f64 / secs
    );
    eprintln!("{}", serde_json::to_string_pretty(&report.conversations.dropped).unwrap());
    eprintln!("{}", serde_json::to_string_pretty(&report.conversations.trimmed).unwrap());
    let tok = aerie_data::tokenizer::TokenizerFiles::load(&tok_dir).unwrap();
    let ds = aerie_data::prepare::PreparedDataset::open(out.path()).unwrap();
    let mut runs = 0;
    for s in ds.samples(aerie_data::prepare::TRAIN).unwrap().take(500) {
        let s = s.unwrap();
        let mut end = None;
        for i in 0..s.input_ids.len() {
            let run_ends = s.loss_mask[i] == 1 && s.loss_mask.get(i + 1) != Some(&1);
            if run_ends && i + 1 < s.input_ids.len() {
                end = Some(s.input_ids[i]);
                runs += 1;
                let text = tok.tokenizer.decode(&[s.input_ids[i]], false).unwrap();
                assert!(text.ends_with("<|im_end|>") || text.ends_with("<|eot_id|>"), "run ends with {text:?}");
            }
        }
        assert!(end.is_some() || s.loss_mask.last() == Some(&1), "{}", s.source_id);
    }
    assert!(runs > 500);

    // Head-only tokenisation (the max-length fast path) equals tokenising everything.
    let template = aerie_data::template::ChatTemplate::resolve(&Default::default(), &tok).unwrap();
    let opts = |max| aerie_data::template::EncodeOptions { max_length: max, ..Default::default() };
    // At 64 tokens most heads end inside a message (cut in the text and checked), at 512 most
    // end at a special token.
    let all = aerie_data::template::ChatEncoder::new(&template, &tok.tokenizer, opts(None)).unwrap();
    for max in [64, 512] {
        let head = aerie_data::template::ChatEncoder::new(&template, &tok.tokenizer, opts(Some(max))).unwrap();
        let reader = ConversationReader::open(&path, &ReadOptions::default()).unwrap();
        let mut compared = 0;
        for raw in reader.take(300) {
            let Ok(n) = normalize(raw.unwrap(), &NormalizeOptions::default()) else { continue };
            let (Ok(Ok(a)), Ok(Ok(b))) = (head.encode(&n.conversation), all.encode(&n.conversation)) else {
                continue;
            };
            let k = a.input_ids.len();
            assert_eq!(a.input_ids, b.input_ids[..k], "{} max {max}", n.conversation.id);
            assert_eq!(a.loss_mask, b.loss_mask[..k], "{} max {max}", n.conversation.id);
            compared += 1;
        }
        assert!(compared > if max == 64 { 100 } else { 200 }, "max {max}: {compared}");
    }
}

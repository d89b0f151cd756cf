//! The real ShareGPT V3 file (assets.md): truncated at 125,509,632 bytes, 17,671 complete
//! conversations before the cut. Runs only with `AERIE_TEST_ASSETS=1` and the file present at
//! `$AERIE_SHAREGPT` (default: `data/assets/ShareGPT_V3_unfiltered_cleaned_split.json` in the
//! workspace).

use std::path::PathBuf;

use aerie_data::conversation::{NormalizeOptions, NormalizeReport, normalize};
use aerie_data::readers::{ConversationReader, InputFormat, ReadOptions};

fn sharegpt_path() -> Option<PathBuf> {
    if std::env::var("AERIE_TEST_ASSETS").as_deref() != Ok("1") {
        return None;
    }
    let path = std::env::var_os("AERIE_SHAREGPT").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/assets/ShareGPT_V3_unfiltered_cleaned_split.json")
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

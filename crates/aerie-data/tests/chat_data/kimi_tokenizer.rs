//! Kimi's tiktoken tokenizer against python tiktoken: ids of the committed fixture
//! (`tests/fixtures/kimi_tiktoken_ids.json`, made by `scripts/kimi_tiktoken_fixtures.py ids`
//! with Kimi's pat_str, specials and pre-splitting over o200k's first 163,584 ranks) must be
//! equal, exactly; decoding must give the text back and every token's byte range must hold
//! that token's bytes.

use aerie_data::tokenizer::{TextTokenizer, TokenizerFiles};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common::*;

fn fixture() -> Value {
    let path = repo_root().join("crates/aerie-data/tests/fixtures/kimi_tiktoken_ids.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

fn text_of(case: &Value) -> String {
    case["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_str().unwrap().repeat(p[1].as_u64().unwrap() as usize))
        .collect()
}

fn ids_sha256(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn kimi_tiktoken_ids_equal_python_tiktoken_on_every_fixture_text() {
    let what = "the Kimi tiktoken reference check";
    let (Some(py), Some(fixtures)) = (python(what), kimi_fixtures(what)) else { return };
    let dir = tempfile::tempdir().unwrap();
    kimi_tokenizer_dir(&py, &fixtures, dir.path());
    let doc = fixture();
    let model = std::fs::read(dir.path().join("tiktoken.model")).unwrap();
    assert_eq!(hex_sha256(&model), doc["tiktoken_model_sha256"].as_str().unwrap(), "not the fixture's rank file");

    let tok = TokenizerFiles::load(dir.path()).unwrap();
    let TextTokenizer::Tiktoken(t) = &tok.tokenizer else { panic!("a tiktoken.model dir must load as tiktoken") };
    assert_eq!(t.num_ranks(), 163_584);
    assert_eq!(tok.tokenizer_vocab_size, 163_840);
    // Kimi's real special ids (reference §3).
    for (name, id) in [("[BOS]", 163_584), ("[EOS]", 163_585), ("<|im_end|>", 163_586), ("<|im_middle|>", 163_601)] {
        assert_eq!(tok.tokenizer.token_to_id(name), Some(id), "{name}");
    }
    assert_eq!(tok.tokenizer.token_to_id("<|reserved_token_163700|>"), Some(163_700));
    assert_eq!(tok.tokenizer.token_to_id("[PAD]"), Some(163_839));
    // The digest covers the rank file and the special names, so it is not the file's hash.
    assert_ne!(tok.digest, hex_sha256(&model));
    assert_eq!(tok.digest, aerie_data::tokenizer::tiktoken_digest(&model, t.specials()));

    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let text = text_of(case);
        let enc = tok.tokenizer.encode(&text, false).unwrap();
        let ids = enc.get_ids();
        assert_eq!(ids.len() as u64, case["n_ids"].as_u64().unwrap(), "{name}: number of ids");
        if let Some(want) = case.get("ids") {
            let want: Vec<u32> = serde_json::from_value(want.clone()).unwrap();
            assert_eq!(ids, want.as_slice(), "{name}");
        }
        assert_eq!(ids_sha256(ids), case["ids_sha256"].as_str().unwrap(), "{name}: ids digest");
        assert_eq!(tok.tokenizer.decode(ids, false).unwrap(), text, "{name}: round trip");
        let mut at = 0;
        for (i, &(s, e)) in enc.get_offsets().iter().enumerate() {
            assert_eq!(s, at, "{name}: token {i} does not start where the previous ended");
            assert_eq!(&text.as_bytes()[s..e], t.token_bytes(ids[i]).unwrap(), "{name}: token {i}'s bytes");
            at = e;
        }
        assert_eq!(at, text.len(), "{name}: offsets cover the text");
    }
}

#[test]
fn a_tiktoken_model_outside_the_kimi_family_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..=255u8).map(|b| format!("{} {b}\n", base64_of(&[b]))).collect();
    std::fs::write(dir.path().join("tiktoken.model"), lines).unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"tokenizer_class": "TikTokenTokenizer"}"#).unwrap();
    let err = TokenizerFiles::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tiktoken.model") && err.contains("not of the Kimi family"), "{err}");

    // The same ranks named Kimi by config.json's model_type load, with 256 specials after them.
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "kimi_k25", "text_config": {"vocab_size": 512}}"#)
        .unwrap();
    let tok = TokenizerFiles::load(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), 512);
    assert_eq!(tok.tokenizer.token_to_id("<|reserved_token_256|>"), Some(256));
    // bytes only: every byte is its own token, specials in text are specials.
    let enc = tok.tokenizer.encode("ab<|reserved_token_300|>", false).unwrap();
    assert_eq!(enc.get_ids(), &[97, 98, 300]);
    assert_eq!(enc.get_offsets(), &[(0, 1), (1, 2), (2, 24)]);

    // A missing rank is an error naming the file and the rank.
    let lines: String = (0..=255u8).filter(|&b| b != 7).map(|b| format!("{} {b}\n", base64_of(&[b]))).collect();
    std::fs::write(dir.path().join("tiktoken.model"), lines).unwrap();
    let err = TokenizerFiles::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tiktoken.model") && err.contains("rank 7 is missing"), "{err}");
}

fn base64_of(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            if k <= c.len() {
                out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The head cut of `data prepare` (only the first `max_length + 1` tokens are tokenised) on Kimi's
/// tiktoken tokenizer and K2's template: ids and masks equal to tokenising everything, for long
/// messages cut inside the text (prose, one unbroken word, digits, CJK, a special token inside an
/// answer) and near special tokens.
#[test]
fn kimi_head_cut_matches_tokenising_everything() {
    use aerie_data::conversation::Role;
    use aerie_data::template::{BuiltinTemplate, ChatEncoder, ChatTemplate, EncodeOptions};
    let what = "the Kimi head-cut check";
    let (Some(py), Some(fixtures)) = (python(what), kimi_fixtures(what)) else { return };
    let dir = tempfile::tempdir().unwrap();
    kimi_tokenizer_dir(&py, &fixtures, dir.path());
    let tok = TokenizerFiles::load(dir.path()).unwrap();
    let template = ChatTemplate::builtin(BuiltinTemplate::KimiK2);
    let prose: String = (0..20_000).map(|i| ["the ", "answer ", "is ", "42, ", "and\n", "ünïcødé "][i % 6]).collect();
    let bodies = [
        prose.clone(),
        "a".repeat(60_000),
        "1234567890".repeat(6_000),
        "日本語のテキスト、".repeat(3_000),
        format!("<|im_middle|> {prose}"),
    ];
    let all = ChatEncoder::new(&template, &tok.tokenizer, EncodeOptions::default()).unwrap();
    let mut compared = 0;
    let mut paths = Vec::new();
    for body in &bodies {
        for (user, answer) in [("hi", body.as_str()), (body.as_str(), "short answer")] {
            let c = conv("long", &[(Role::User, user), (Role::Assistant, answer), (Role::User, "more?")]);
            let full = all.encode(&c).unwrap().unwrap();
            for max in [1usize, 7, 64, 300, 1000] {
                let opts = EncodeOptions { max_length: Some(max), ..EncodeOptions::default() };
                let head = ChatEncoder::new(&template, &tok.tokenizer, opts).unwrap();
                let what = format!("max {max} body {:?}…", &body[..12]);
                match head.encode(&c).unwrap() {
                    Ok(s) => {
                        let n = max.min(full.input_ids.len());
                        assert_eq!(s.input_ids, full.input_ids[..n], "{what}");
                        assert_eq!(s.loss_mask, full.loss_mask[..n], "{what}");
                        compared += 1;
                    }
                    Err(_) => assert!(full.loss_mask[..max].iter().all(|&m| m == 0), "{what}"),
                }
                paths.push(head.head_paths());
            }
        }
    }
    assert!(compared > 10, "{compared}");
    // The comparison says something about the head cut only where it was taken.
    let inside_text: u64 = paths.iter().map(|p| p.inside_text).sum();
    assert!(inside_text > 10, "head paths taken: {paths:?}");
}

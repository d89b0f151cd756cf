//! End to end: a tiny llama GGUF → HF directory, read back with `safetensors` and `tokenizers`.

use std::path::Path;

use aerie_hub::gguf::{ImportOptions, import_gguf};
use safetensors::SafeTensors;
use serde_json::Value as Json;
use tokenizers::Tokenizer;

use crate::model::{FFN, HEAD_DIM, HEADS, HIDDEN, KV_HEADS, LAYERS, id_of, tiny_llama};

fn read_json(path: &Path) -> Json {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn convert(tied: bool, pre: &str) -> (tempfile::TempDir, crate::model::TinyModel, aerie_hub::gguf::ImportReport) {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_llama(tied, pre);
    let src = dir.path().join("tiny.gguf");
    m.writer.write(&src);
    let report = import_gguf(&src, &dir.path().join("nested/out"), ImportOptions::default()).unwrap();
    (dir, m, report)
}

#[test]
fn tied_model_round_trips() {
    let (dir, m, report) = convert(true, "smollm");
    let out = dir.path().join("nested/out");
    assert!(report.tie_word_embeddings);
    assert_eq!(report.tensors, 2 + 9 * LAYERS);
    assert_eq!(report.source_types["Q4_1"], 4);

    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), m.expected.len());
    assert!(st.tensor("lm_head.weight").is_err());
    for (name, (shape, want)) in &m.expected {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        assert_eq!(t.shape(), shape.as_slice(), "{name}");
        let got: Vec<f32> = t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(&got, want, "{name}: values differ (Q/K permutation or dequantisation)");
    }

    let c = read_json(&out.join("config.json"));
    assert_eq!(c["architectures"][0], "LlamaForCausalLM");
    // The import records where the model lives: drafters trained on it name it as their target.
    assert_eq!(c["_name_or_path"], std::path::absolute(&out).unwrap().display().to_string());
    assert_eq!(c["hidden_size"], HIDDEN);
    assert_eq!(c["intermediate_size"], FFN);
    assert_eq!(c["num_hidden_layers"], LAYERS);
    assert_eq!(c["num_attention_heads"], HEADS);
    assert_eq!(c["num_key_value_heads"], KV_HEADS);
    assert_eq!(c["head_dim"], HEAD_DIM);
    assert_eq!(c["rms_norm_eps"], 1e-5);
    assert_eq!(c["rope_theta"], 10000.0);
    assert_eq!(c["max_position_embeddings"], 256);
    assert_eq!(c["vocab_size"], m.vocab.len());
    assert_eq!((c["bos_token_id"].clone(), c["eos_token_id"].clone()), (1.into(), 2.into()));
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(c["torch_dtype"], "float32");
    assert_eq!(c["rope_scaling"], Json::Null);
    let g = read_json(&out.join("generation_config.json"));
    assert_eq!(
        (g["bos_token_id"].clone(), g["eos_token_id"].clone(), g["pad_token_id"].clone()),
        (1.into(), 2.into(), 2.into())
    );

    let tc = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["pad_token"], "<|im_end|>");
    assert_eq!(tc["unk_token"], "<|endoftext|>");
    assert_eq!(tc["model_max_length"], 256);
    assert_eq!(tc["add_bos_token"], false);
    assert!(tc["chat_template"].as_str().unwrap().starts_with("{% for m in messages %}"));
    assert_eq!(tc["added_tokens_decoder"]["3"]["special"], false);

    let tok = Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let ids = |s: &str| tok.encode(s, false).unwrap().get_ids().to_vec();
    let id = |t: &str| id_of(&m.vocab, t);
    assert_eq!(ids("hello world"), [id("hello"), id("Ġworld")]);
    // smollm isolates digits: the merge "2 0" must not apply.
    assert_eq!(ids("2024"), [id("2"), id("0"), id("2"), id("4")]);
    assert_eq!(ids("<|im_start|>hello<|im_end|>"), [1, id("hello"), 2]);
    assert_eq!(ids("<tool>"), [3]);
    for s in ["hello world", "2024 ünï 日本 🦙\n\t x  ", "<|im_end|> a"] {
        assert_eq!(tok.decode(&ids(s), false).unwrap(), s);
    }
    assert_eq!(tok.get_vocab_size(true), m.vocab.len());
}

#[test]
fn untied_model_and_gpt2_pre_tokenizer() {
    let (dir, m, report) = convert(false, "gpt-2");
    let out = dir.path().join("nested/out");
    assert!(!report.tie_word_embeddings);
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let head = st.tensor("lm_head.weight").unwrap();
    let got: Vec<f32> = head.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(got, m.expected["lm_head.weight"].1);
    assert_eq!(read_json(&out.join("config.json"))["tie_word_embeddings"], false);
    let tok = Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    // GPT-2 splitting keeps digit runs together, so the merge "2 0" applies.
    let id = |t: &str| id_of(&m.vocab, t);
    assert_eq!(tok.encode("2024", false).unwrap().get_ids(), [id("20"), id("2"), id("4")]);
}

#[test]
fn llama3_pre_tokenizer_adds_bos() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = tiny_llama(true, "llama-bpe");
    m.writer.kv("tokenizer.ggml.add_bos_token", aerie_hub::gguf::Value::Bool(true));
    let src = dir.path().join("tiny.gguf");
    m.writer.write(&src);
    import_gguf(&src, &dir.path().join("out"), ImportOptions::default()).unwrap();
    let tok = Tokenizer::from_file(dir.path().join("out/tokenizer.json")).unwrap();
    let id = |t: &str| id_of(&m.vocab, t);
    // Llama 3 splits digits in runs of up to three; BOS is prepended when special tokens are added.
    assert_eq!(tok.encode("2024", true).unwrap().get_ids(), [1, id("20"), id("2"), id("4")]);
    assert_eq!(tok.encode("hello", false).unwrap().get_ids(), [id("hello")]);
}

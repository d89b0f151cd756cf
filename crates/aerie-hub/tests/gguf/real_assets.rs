//! Tests on real files, skipped (with a note) unless `AERIE_TEST_ASSETS=1`:
//!
//! - `real_assets_smollm2_import`: the SmolLM2-135M-Instruct Q4_1 GGUF (assets.md) where
//!   `aerie assets fetch` puts it under `$AERIE_HOME`, or at `$AERIE_SMOLLM2_GGUF`. Expected token ids
//!   are llama.cpp's tokenisation of the same file (an independent implementation), and the
//!   weight values were computed with gguf-py's numpy dequantiser and the Python `permute`.
//! - `real_assets_llama_cpp_vocab_vectors`: llama.cpp's `models/ggml-vocab-*.gguf` vocabularies
//!   with their `.inp`/`.out` test vectors, which llama.cpp generated with the original HF
//!   tokenizers (`convert_hf_to_gguf_update.py`), from `$AERIE_LLAMA_CPP_MODELS`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use aerie_hub::gguf::{GgufFile, GgufVocab, ImportOptions, import_gguf};
use safetensors::SafeTensors;
use serde_json::Value as Json;
use tokenizers::Tokenizer;

fn enabled(test: &str) -> bool {
    let on = std::env::var("AERIE_TEST_ASSETS").is_ok_and(|v| v == "1");
    if !on {
        println!("note: {test} skipped; set AERIE_TEST_ASSETS=1 to run it on the real files");
    }
    on
}

/// `$AERIE_SMOLLM2_GGUF`, else where `aerie assets fetch` puts it
/// (`$AERIE_HOME/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`).
fn smollm2_gguf() -> PathBuf {
    match std::env::var_os("AERIE_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => aerie_hub::assets::asset_path(aerie_hub::assets::Asset::Smollm2),
    }
}

fn f32s(st: &SafeTensors<'_>, name: &str, start: usize, n: usize) -> Vec<f32> {
    let t = st.tensor(name).unwrap();
    t.data()[start * 4..(start + n) * 4].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

#[test]
fn real_assets_smollm2_import() {
    if !enabled("real_assets_smollm2_import") {
        return;
    }
    let src = smollm2_gguf();
    if !src.is_file() {
        println!("note: real_assets_smollm2_import skipped: {} is missing (run `aerie assets fetch`)", src.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2");
    let t0 = Instant::now();
    let report = import_gguf(&src, &out, ImportOptions::default()).unwrap();
    println!("converted {} in {:.2?}", src.display(), t0.elapsed());
    assert_eq!(report.tensors, 272);
    assert_eq!(report.parameters, 134_515_008);
    assert_eq!(report.source_types.get("Q4_1"), Some(&210));
    assert_eq!(report.source_types.get("Q8_0"), Some(&1));

    let c: Json = serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    for (key, want) in [
        ("num_hidden_layers", Json::from(30)),
        ("hidden_size", 576.into()),
        ("intermediate_size", 1536.into()),
        ("num_attention_heads", 9.into()),
        ("num_key_value_heads", 3.into()),
        ("head_dim", 64.into()),
        ("vocab_size", 49152.into()),
        ("rope_theta", 100000.0.into()),
        ("rms_norm_eps", 1e-5.into()),
        ("max_position_embeddings", 8192.into()),
        ("tie_word_embeddings", true.into()),
        ("bos_token_id", 1.into()),
        ("eos_token_id", 2.into()),
        ("pad_token_id", 2.into()),
    ] {
        assert_eq!(c[key], want, "config.json {key}");
    }
    let tc: Json = serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap()).unwrap();
    assert!(tc["chat_template"].as_str().unwrap().contains("You are a helpful AI assistant named SmolLM"));

    let file = std::fs::File::open(out.join("model.safetensors")).unwrap();
    let bytes = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), 272);
    for (name, shape) in [
        ("model.embed_tokens.weight", vec![49152, 576]),
        ("model.layers.0.self_attn.q_proj.weight", vec![576, 576]),
        ("model.layers.0.self_attn.k_proj.weight", vec![192, 576]),
        ("model.layers.0.self_attn.v_proj.weight", vec![192, 576]),
        ("model.layers.29.self_attn.o_proj.weight", vec![576, 576]),
        ("model.layers.29.mlp.gate_proj.weight", vec![1536, 576]),
        ("model.layers.29.mlp.down_proj.weight", vec![576, 1536]),
        ("model.layers.29.input_layernorm.weight", vec![576]),
        ("model.norm.weight", vec![576]),
    ] {
        assert_eq!(st.tensor(name).unwrap().shape(), shape.as_slice(), "{name}");
    }
    // Values from gguf-py (numpy dequantisation) with the Python permute undone: HF row 1 of
    // q_proj is GGUF row 2, HF row 32 of k_proj is GGUF row 1.
    // Every value is an f16 scale times a small integer (plus an f16 min), exact in f32.
    let widen = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
    assert_eq!(widen(f32s(&st, "model.layers.0.self_attn.q_proj.weight", 576, 4)), Q_ROW1, "q_proj row 1");
    assert_eq!(widen(f32s(&st, "model.layers.0.self_attn.k_proj.weight", 32 * 576, 4)), K_ROW32, "k_proj row 32");
    assert_eq!(widen(f32s(&st, "model.embed_tokens.weight", 576, 4)), EMBED_ROW1, "embed row 1");

    let tok = Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let ids = |s: &str| tok.encode(s, false).unwrap().get_ids().to_vec();
    assert_eq!(ids("What is the capital of France?"), [1780, 314, 260, 3575, 282, 4649, 47]);
    assert_eq!(ids("<|im_start|>"), [1]);
    assert_eq!(ids("<|im_end|>"), [2]);
    for (text, want) in LLAMA_CPP_IDS {
        assert_eq!(ids(text), *want, "{text:?}");
        assert_eq!(tok.decode(&ids(text), false).unwrap(), *text);
    }
}

#[test]
fn real_assets_llama_cpp_vocab_vectors() {
    if !enabled("real_assets_llama_cpp_vocab_vectors") {
        return;
    }
    let Ok(models) = std::env::var("AERIE_LLAMA_CPP_MODELS") else {
        println!(
            "note: real_assets_llama_cpp_vocab_vectors skipped: set AERIE_LLAMA_CPP_MODELS to llama.cpp's models/"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for name in ["gpt-2", "starcoder", "refact", "command-r", "llama-bpe", "mpt"] {
        let path = Path::new(&models).join(format!("ggml-vocab-{name}.gguf"));
        let vocab = GgufVocab::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        let json_path = dir.path().join(format!("{name}.json"));
        std::fs::write(&json_path, serde_json::to_string(&vocab.tokenizer_json()).unwrap()).unwrap();
        let tok = Tokenizer::from_file(&json_path).unwrap();
        let inp = std::fs::read_to_string(path.with_extension("gguf.inp")).unwrap();
        let out = std::fs::read_to_string(path.with_extension("gguf.out")).unwrap();
        let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        let mut checked = 0;
        for (text, line) in texts.iter().zip(out.lines()) {
            let want: Vec<u32> = line.split_whitespace().map(|t| t.parse().unwrap()).collect();
            assert_eq!(tok.encode(*text, false).unwrap().get_ids(), want.as_slice(), "{name}: {text:?}");
            checked += 1;
        }
        println!("{name}: {checked} test vectors match ({:?})", vocab.pre);
    }
}

/// gguf-py: dequantised `blk.0.attn_q.weight` row 2, the first 4 values.
const Q_ROW1: [f64; 4] = [-0.1591796875, 0.39794921875, -0.0198974609375, -1.2734375];
/// gguf-py: dequantised `blk.0.attn_k.weight` row 1, the first 4 values.
const K_ROW32: [f64; 4] = [0.056640625, 0.056640625, -0.126953125, 0.1484375];
/// gguf-py: dequantised `token_embd.weight` row 1, the first 4 values.
const EMBED_ROW1: [f64; 4] = [-0.0238037109375, -0.015869140625, -0.0396728515625, 0.015869140625];

/// llama.cpp 0.3.x (llama-cpp-python, `tokenize(special=True)`) on the same GGUF file.
const LLAMA_CPP_IDS: &[(&str, &[u32])] = &[
    ("What is the capital of France?", &[1780, 314, 260, 3575, 282, 4649, 47]),
    (
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        &[1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
    ),
    (
        "In 2024, 3.14159 and 1,000,000 people paid $12.50!",
        &[
            788, 216, 34, 32, 34, 36, 28, 216, 35, 30, 33, 36, 33, 37, 41, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32,
            32, 701, 5940, 1885, 33, 34, 30, 37, 32, 17,
        ],
    ),
    ("Hello   world\n\n\tTabs and  spaces   ", &[19556, 256, 905, 1116, 197, 68, 7366, 284, 216, 5600, 333]),
    (" leading space", &[2899, 1898]),
    ("trailing space ", &[4861, 4966, 1898, 216]),
    ("ünïcödé café naïve résumé", &[47682, 25972, 83, 7466, 84, 2756, 37366, 15486, 46494, 412, 2756, 5422, 2756]),
    (
        "日本語のテキストと中文文本",
        &[
            23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 7365, 118, 28589,
            29184, 29184, 40993,
        ],
    ),
    (
        "Emoji 🦙🚀 and ½ ² ३४",
        &[10809, 33777, 15107, 116, 243, 10813, 244, 218, 284, 216, 16738, 216, 19133, 216, 9310, 119, 9310, 120],
    ),
    (
        "def f(x):\n    return x**2  # comment\n",
        &[1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 5189, 198],
    ),
    ("I'm you're they've we'll he'd it's", &[57, 5248, 346, 2316, 502, 3543, 392, 3060, 384, 6737, 357, 506]),
    (
        "MiXeD CaSe WORDS and snake_case_names",
        &[42300, 72, 85, 52, 7784, 4393, 35612, 8521, 284, 14321, 79, 7544, 79, 6464],
    ),
    ("<|endoftext|>", &[0]),
    ("a<|im_end|>b", &[81, 2, 82]),
    ("  ", &[256]),
    ("\n", &[198]),
    ("", &[]),
    (
        "x = [1, 2, 3]; y = {'a': 10}",
        &[104, 446, 933, 33, 28, 216, 34, 28, 216, 35, 26695, 329, 446, 7353, 81, 1539, 216, 33, 32, 109],
    ),
];

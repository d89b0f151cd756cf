//! HF `tokenizer.json` and `tokenizer_config.json` from a GGUF byte-level BPE vocabulary
//! (`tokenizer.ggml.model = "gpt2"`).
//!
//! The vocabulary, merges and token types map one to one. What GGUF does not store is the
//! pre-tokenizer: it stores only its name, `tokenizer.ggml.pre`, which llama.cpp
//! (`src/llama-vocab.cpp`, `llm_tokenizer_bpe`) turns into a list of regexes applied one after
//! the other, each splitting the pieces of the previous one. [`PreTokenizer::from_gguf_name`]
//! maps each name aerie supports to the HF pre-tokenizer that splits the same way:
//!
//! - `gpt-2` and kin: llama.cpp's one regex is GPT-2's
//!   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`, which is what HF
//!   `ByteLevel(add_prefix_space: false, use_regex: true)` splits with (HF's extra trailing
//!   `|\s+` only matches what llama.cpp's splitter keeps as an unmatched piece anyway).
//! - `smollm`, `starcoder`, `refact`, `command-r`, … (`LLAMA_VOCAB_PRE_TYPE_SMOLLM` shares its
//!   case with STARCODER): `\p{N}` first, isolating every digit, then the GPT-2 regex. HF's
//!   `Digits(individual_digits: true)` isolates every `char::is_numeric` character (Unicode
//!   Nd, Nl, No: `\p{N}`), so the equivalent is `Sequence[Digits(individual), ByteLevel]`,
//!   which is also what HuggingFaceTB/SmolLM-135M's `tokenizer.json` ships (llama.cpp's
//!   `convert_hf_to_gguf_update.py` names that repository as the source of `smollm`).
//! - `llama-bpe`/`llama3` and kin: HF `Split(<Llama 3 regex>, Isolated)` then
//!   `ByteLevel(use_regex: false)`, with `ignore_merges: true`, as Meta's `tokenizer.json`.
//!
//! Any other name is an error rather than a guess: a wrong pre-tokenizer gives different ids
//! without any error message. Token types: `CONTROL` (3) and `UNKNOWN` (2) become special added
//! tokens, `USER_DEFINED` (4) non-special added tokens.

use serde_json::{Map, Value as Json, json};

use super::reader::GgufFile;
use crate::error::{Error, Result};

/// llama.cpp token types (`enum llama_token_type`).
const TOKEN_UNKNOWN: i128 = 2;
const TOKEN_CONTROL: i128 = 3;
const TOKEN_USER_DEFINED: i128 = 4;

const GPT2_NAMES: &[&str] = &[
    "gpt-2",
    "phi-2",
    "mpt",
    "olmo",
    "jais",
    "trillion",
    "roberta-bpe",
    "jina-v1-en",
    "jina-v2-code",
    "jina-es",
    "jina-de",
    "jina-v2-es",
    "jina-v2-de",
    "gigachat",
    "mellum",
    "modern-bert",
    "a.x-4.0",
    "exaone4",
    "granite-docling",
];
const DIGITS_GPT2_NAMES: &[&str] =
    &["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"];
const LLAMA3_NAMES: &[&str] =
    &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"];

/// Meta Llama 3's split regex, as in its `tokenizer.json`.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The HF pre-tokenizers aerie can produce, by the llama.cpp regex family they reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreTokenizer {
    /// `ByteLevel(add_prefix_space: false, use_regex: true)`.
    Gpt2,
    /// `Sequence[Digits(individual_digits: true), ByteLevel(add_prefix_space: false, use_regex: true)]`.
    DigitsGpt2,
    /// `Sequence[Split(Llama 3 regex, Isolated), ByteLevel(add_prefix_space: false, use_regex: false)]`.
    Llama3,
}

impl PreTokenizer {
    /// The HF equivalent of llama.cpp's `tokenizer.ggml.pre` value, if aerie knows it.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        if GPT2_NAMES.contains(&name) {
            Some(Self::Gpt2)
        } else if DIGITS_GPT2_NAMES.contains(&name) {
            Some(Self::DigitsGpt2)
        } else if LLAMA3_NAMES.contains(&name) {
            Some(Self::Llama3)
        } else {
            None
        }
    }

    fn json(self) -> Json {
        let byte_level = |use_regex| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
        match self {
            Self::Gpt2 => byte_level(true),
            Self::DigitsGpt2 => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true),
            ]}),
            Self::Llama3 => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": false},
                byte_level(false),
            ]}),
        }
    }
}

/// A token that HF keeps outside BPE (`added_tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedToken {
    /// Token id.
    pub id: u32,
    /// Token text.
    pub content: String,
    /// Special (control) or user-defined.
    pub special: bool,
}

/// The tokenizer part of a GGUF file's metadata, validated.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    /// Token texts by id.
    pub tokens: Vec<String>,
    /// Merges as pairs, by rank.
    pub merges: Vec<(String, String)>,
    /// Control, unknown and user-defined tokens.
    pub added: Vec<AddedToken>,
    /// `tokenizer.ggml.pre`.
    pub pre_name: String,
    /// The HF pre-tokenizer for it.
    pub pre: PreTokenizer,
    /// Beginning-of-sequence id.
    pub bos: Option<u32>,
    /// End-of-sequence id.
    pub eos: Option<u32>,
    /// Unknown-token id.
    pub unk: Option<u32>,
    /// Padding id.
    pub pad: Option<u32>,
    /// Prepend BOS when encoding (`tokenizer.ggml.add_bos_token`; llama.cpp's default per
    /// pre-tokenizer when absent).
    pub add_bos: bool,
    /// Append EOS when encoding (`tokenizer.ggml.add_eos_token`, default false).
    pub add_eos: bool,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl GgufVocab {
    /// Read and validate the vocabulary of `gguf`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let unsupported = |problem: String| Error::GgufUnsupported { path: gguf.path().to_path_buf(), problem };
        match gguf.get_str("tokenizer.ggml.model")? {
            Some("gpt2") => {}
            Some(other) => {
                return Err(unsupported(format!(
                    "tokenizer.ggml.model is `{other}`; only byte-level BPE (`gpt2`) vocabularies are converted"
                )));
            }
            None => return Err(unsupported("the file has no tokenizer (tokenizer.ggml.model)".into())),
        }
        let pre_name = gguf.get_str("tokenizer.ggml.pre")?.unwrap_or("").to_string();
        let pre = PreTokenizer::from_gguf_name(&pre_name).ok_or_else(|| {
            unsupported(format!(
                "tokenizer.ggml.pre `{pre_name}` has no known HF equivalent (known: {}, {}, {}); \
                 a guessed pre-tokenizer would silently change token ids",
                DIGITS_GPT2_NAMES.join(", "),
                GPT2_NAMES.join(", "),
                LLAMA3_NAMES.join(", ")
            ))
        })?;

        let missing = |key: &str| gguf.format_error(format!("`{key}` is missing"));
        let tokens: Vec<String> = gguf
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| missing("tokenizer.ggml.tokens"))?
            .into_iter()
            .map(str::to_string)
            .collect();
        let n = tokens.len();
        let mut seen = std::collections::HashMap::with_capacity(n);
        for (id, t) in tokens.iter().enumerate() {
            if let Some(first) = seen.insert(t.as_str(), id) {
                return Err(unsupported(format!("token {id} duplicates token {first} (`{t}`)")));
            }
        }
        let types = gguf.get_int_array("tokenizer.ggml.token_type")?.unwrap_or_else(|| vec![1; n]);
        if types.len() != n {
            return Err(
                gguf.format_error(format!("tokenizer.ggml.token_type has {} entries for {n} tokens", types.len()))
            );
        }
        let added = types
            .iter()
            .enumerate()
            .filter(|&(_, &t)| matches!(t, TOKEN_UNKNOWN | TOKEN_CONTROL | TOKEN_USER_DEFINED))
            .map(|(id, &t)| AddedToken { id: id as u32, content: tokens[id].clone(), special: t != TOKEN_USER_DEFINED })
            .collect();

        let merges = gguf
            .get_str_array("tokenizer.ggml.merges")?
            .ok_or_else(|| missing("tokenizer.ggml.merges"))?
            .into_iter()
            .enumerate()
            .map(|(rank, m)| match m.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                    Ok((a.to_string(), b.to_string()))
                }
                _ => Err(gguf.format_error(format!("merge {rank} `{m}` is not two tokens separated by one space"))),
            })
            .collect::<Result<Vec<_>>>()?;

        let id = |key: &str| -> Result<Option<u32>> {
            match gguf.get_u64(key)? {
                None => Ok(None),
                Some(id) if id < n as u64 => Ok(Some(id as u32)),
                Some(id) => Err(gguf.format_error(format!("`{key}` = {id} is outside the {n}-token vocabulary"))),
            }
        };
        Ok(Self {
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos: gguf.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(pre == PreTokenizer::Llama3),
            add_eos: gguf.get_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            chat_template: gguf.get_str("tokenizer.chat_template")?.map(str::to_string),
            tokens,
            merges,
            added,
            pre_name,
            pre,
        })
    }

    fn token(&self, id: Option<u32>) -> Option<&str> {
        id.map(|id| self.tokens[id as usize].as_str())
    }

    /// The post-processor: byte-level offsets, plus BOS/EOS when the vocabulary adds them.
    fn post_processor(&self) -> Json {
        let byte_level =
            json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true});
        let bos = self.bos.filter(|_| self.add_bos);
        let eos = self.eos.filter(|_| self.add_eos);
        if bos.is_none() && eos.is_none() {
            return byte_level;
        }
        let special =
            |id: u32, type_id: u32| json!({"SpecialToken": {"id": self.tokens[id as usize], "type_id": type_id}});
        let seq = |type_id: u32| {
            let mut items = Vec::new();
            items.extend(bos.map(|id| special(id, type_id)));
            items.push(json!({"Sequence": {"id": if type_id == 0 { "A" } else { "B" }, "type_id": type_id}}));
            items.extend(eos.map(|id| special(id, type_id)));
            items
        };
        let mut specials = Map::new();
        for id in bos.into_iter().chain(eos) {
            let t = &self.tokens[id as usize];
            specials.insert(t.clone(), json!({"id": t, "ids": [id], "tokens": [t]}));
        }
        let pair = [seq(0), seq(1)].concat();
        let template = json!({
            "type": "TemplateProcessing",
            "single": seq(0),
            "pair": pair,
            "special_tokens": specials,
        });
        json!({"type": "Sequence", "processors": [byte_level, template]})
    }

    /// The HF `tokenizer.json` document.
    pub fn tokenizer_json(&self) -> Json {
        let vocab: Map<String, Json> =
            self.tokens.iter().enumerate().map(|(id, t)| (t.clone(), Json::from(id))).collect();
        let merges: Vec<Json> = self.merges.iter().map(|(a, b)| json!([a, b])).collect();
        let added: Vec<Json> = self
            .added
            .iter()
            .map(|t| {
                json!({"id": t.id, "content": t.content, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": t.special})
            })
            .collect();
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": self.pre.json(),
            "post_processor": self.post_processor(),
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE",
                "dropout": null,
                "unk_token": null,
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": false,
                "byte_fallback": false,
                "ignore_merges": self.pre == PreTokenizer::Llama3,
                "vocab": vocab,
                "merges": merges,
            },
        })
    }

    /// The HF `tokenizer_config.json` document; `model_max_length` is the context length.
    pub fn tokenizer_config_json(&self, model_max_length: Option<u64>) -> Json {
        let decoder: Map<String, Json> = self
            .added
            .iter()
            .map(|t| {
                let entry = json!({"content": t.content, "lstrip": false, "normalized": false,
                                   "rstrip": false, "single_word": false, "special": t.special});
                (t.id.to_string(), entry)
            })
            .collect();
        let mut c = Map::new();
        c.insert("add_bos_token".into(), self.add_bos.into());
        c.insert("add_eos_token".into(), self.add_eos.into());
        c.insert("added_tokens_decoder".into(), decoder.into());
        for (key, id) in
            [("bos_token", self.bos), ("eos_token", self.eos), ("pad_token", self.pad), ("unk_token", self.unk)]
        {
            c.insert(key.into(), self.token(id).map_or(Json::Null, Json::from));
        }
        if let Some(t) = &self.chat_template {
            c.insert("chat_template".into(), t.as_str().into());
        }
        c.insert("clean_up_tokenization_spaces".into(), false.into());
        if let Some(n) = model_max_length {
            c.insert("model_max_length".into(), n.into());
        }
        c.insert("tokenizer_class".into(), "PreTrainedTokenizerFast".into());
        c.insert("vocab_size".into(), self.tokens.len().into());
        c.into()
    }
}

//! A tokenizer directory as Hugging Face lays it out: `tokenizer.json` (the `tokenizers`
//! pipeline) or, for the Kimi family, `tiktoken.model` ([`tiktoken`]), `tokenizer_config.json` (special-token strings, `chat_template` as one string or a
//! list of named templates), optionally `chat_template.jinja` / `chat_template.json` (where
//! recent transformers save the template) and `config.json` (the model's `vocab_size`, which may
//! exceed the tokenizer's: embedding rows are padded).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::Value;
use serde_json::{Map, Value as Json};
use tokenizers::Tokenizer;

use crate::{Error, Result};

mod text;
pub mod tiktoken;

pub use text::{AddedToken, Encoded, TextTokenizer};

/// The files of a tokenizer directory, loaded.
pub struct TokenizerFiles {
    /// The directory.
    pub dir: PathBuf,
    /// The tokenizer (for `tokenizer.json`: with its truncation and padding switched off).
    pub tokenizer: TextTokenizer,
    /// `tokenizer_config.json`, empty when absent.
    pub config: Map<String, Json>,
    /// The tokenizer digest, hex: sha256 of `tokenizer.json`, or for a tiktoken tokenizer
    /// sha256 of `tiktoken.model`'s bytes followed by one `{id}\t{name}\n` line per special
    /// token in id order (the rule of `docs/shard-format.md`).
    pub digest: String,
    /// Largest token id + 1, added tokens included.
    pub tokenizer_vocab_size: usize,
    /// `vocab_size` of `config.json` (or its `text_config`), when present.
    pub model_vocab_size: Option<usize>,
}

impl std::fmt::Debug for TokenizerFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizerFiles")
            .field("dir", &self.dir)
            .field("digest", &self.digest)
            .field("tokenizer_vocab_size", &self.tokenizer_vocab_size)
            .field("model_vocab_size", &self.model_vocab_size)
            .finish_non_exhaustive()
    }
}

fn tok_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Tokenizer { path: path.to_owned(), message: message.into() }
}

fn read_json(path: &Path) -> Result<Option<Json>> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map(Some).map_err(|e| tok_err(path, format!("not valid JSON: {e}")))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// A special-token entry: a plain string, or transformers' serialised `AddedToken`
/// (`{"content": "<s>", ...}`).
fn token_string(v: &Json) -> Option<&str> {
    match v {
        Json::String(s) => Some(s),
        Json::Object(o) => o.get("content").and_then(Json::as_str),
        _ => None,
    }
}

impl TokenizerFiles {
    /// Load `path`: a directory holding `tokenizer.json` (or, of the Kimi family,
    /// `tiktoken.model`), or the `tokenizer.json` / `tiktoken.model` file itself.
    pub fn load(path: &Path) -> Result<Self> {
        let dir = if path.is_dir() { path.to_owned() } else { crate::paths::parent_dir(path).to_owned() };
        let named = |n: &str| path.is_file() && path.file_name().is_some_and(|f| f == n);
        let hf = if path.is_dir() { dir.join("tokenizer.json") } else { path.to_owned() };
        let tiktoken_file = dir.join("tiktoken.model");
        let config = match read_json(&dir.join("tokenizer_config.json"))? {
            Some(Json::Object(m)) => m,
            Some(_) => {
                return Err(tok_err(&dir.join("tokenizer_config.json"), "not a JSON object"));
            }
            None => Map::new(),
        };
        let model_config = read_json(&dir.join("config.json"))?;
        let model_vocab_size =
            model_config.as_ref().and_then(|c| crate::hf_config::text_key(c, "vocab_size").and_then(Json::as_u64));
        // Recorded in every prepared dataset and sized from later: bounded before it is kept.
        if let Some(v) = model_vocab_size {
            crate::limits::vocab(format!("{}: vocab_size", dir.join("config.json").display()), v)?;
        }
        let model_vocab_size = model_vocab_size.map(|v| v as usize);
        let (tokenizer, digest) = if named("tiktoken.model") || (!hf.is_file() && tiktoken_file.is_file()) {
            check_kimi_family(&tiktoken_file, &config, model_config.as_ref())?;
            let bytes = std::fs::read(&tiktoken_file).map_err(|e| Error::io(&tiktoken_file, e))?;
            let tok = tiktoken::Tiktoken::from_bytes(&tiktoken_file, &bytes, &config)?;
            let digest = tiktoken_digest(&bytes, tok.specials());
            (TextTokenizer::Tiktoken(Box::new(tok)), digest)
        } else {
            if !hf.is_file() {
                return Err(tok_err(
                    &hf,
                    "no tokenizer.json (a Hugging Face `tokenizers` file) and no tiktoken.model (Kimi family)",
                ));
            }
            let mut tokenizer = Tokenizer::from_file(&hf).map_err(|e| tok_err(&hf, format!("cannot load: {e}")))?;
            tokenizer.with_truncation(None).map_err(|e| tok_err(&hf, format!("cannot disable truncation: {e}")))?;
            tokenizer.with_padding(None);
            (TextTokenizer::Hf(Box::new(tokenizer)), crate::shard::sha256_file(&hf)?)
        };
        let tokenizer_vocab_size = tokenizer.vocab_size();
        Ok(Self { dir, tokenizer, config, digest, tokenizer_vocab_size, model_vocab_size })
    }

    /// The file the tokenizer was loaded from (`tokenizer.json` or `tiktoken.model`), for
    /// messages.
    pub fn file(&self) -> PathBuf {
        self.dir.join(match self.tokenizer {
            TextTokenizer::Hf(_) => "tokenizer.json",
            TextTokenizer::Tiktoken(_) => "tiktoken.model",
        })
    }

    /// The target vocabulary size V: the model's `vocab_size` when `config.json` gives one
    /// (never below the tokenizer's), else the tokenizer's.
    pub fn vocab_size(&self) -> usize {
        self.model_vocab_size.unwrap_or(0).max(self.tokenizer_vocab_size)
    }

    /// The special-token variables a template is rendered with: every `*_token` string of
    /// `tokenizer_config.json` (`bos_token`, `eos_token`, `pad_token`, ...) and
    /// `additional_special_tokens`, as transformers passes `special_tokens_map`.
    pub fn special_tokens(&self) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        for (k, v) in &self.config {
            if k.ends_with("_token")
                && let Some(s) = token_string(v)
            {
                out.insert(k.clone(), Value::from(s));
            } else if k == "additional_special_tokens"
                && let Some(list) = v.as_array()
            {
                let items: Vec<Value> = list.iter().filter_map(token_string).map(Value::from).collect();
                out.insert(k.clone(), Value::from(items));
            }
        }
        out
    }

    /// The chat template called `name` (`None`: the default one) as (label, source). Looked up
    /// in `chat_template.jinja` (which transformers prefers when present), then
    /// `tokenizer_config.json`'s `chat_template` (a string, or a list of `{name, template}`),
    /// then `chat_template.json`.
    pub fn chat_template(&self, name: Option<&str>) -> Result<Option<(String, String)>> {
        let cfg_path = self.dir.join("tokenizer_config.json");
        let mut sources: Vec<(String, Json)> = Vec::new();
        let jinja = self.dir.join("chat_template.jinja");
        if jinja.is_file() {
            let text = std::fs::read_to_string(&jinja).map_err(|e| Error::io(&jinja, e))?;
            sources.push((jinja.display().to_string(), Json::String(text)));
        }
        if let Some(t) = self.config.get("chat_template") {
            sources.push((cfg_path.display().to_string(), t.clone()));
        }
        let json = self.dir.join("chat_template.json");
        if let Some(Json::Object(o)) = read_json(&json)?
            && let Some(t) = o.get("chat_template")
        {
            sources.push((json.display().to_string(), t.clone()));
        }
        for (label, value) in sources {
            match (&value, name) {
                (Json::String(s), None | Some("default")) => return Ok(Some((label, s.clone()))),
                (Json::String(_), Some(_)) => {}
                (Json::Array(list), _) => {
                    let want = name.unwrap_or("default");
                    for entry in list {
                        let n = entry.get("name").and_then(Json::as_str);
                        let t = entry.get("template").and_then(Json::as_str);
                        if let (Some(n), Some(t)) = (n, t)
                            && n == want
                        {
                            return Ok(Some((format!("{label} [{n}]"), t.to_owned())));
                        }
                    }
                }
                _ => {
                    return Err(tok_err(
                        Path::new(&label),
                        "`chat_template` is neither a string nor a list of {name, template}",
                    ));
                }
            }
        }
        Ok(None)
    }
}

/// A `tiktoken.model` is read only for the Kimi family, whose split pattern and special-token
/// rule aerie knows ([`tiktoken::KIMI_PAT_STR`]); other tiktoken models keep theirs in Python
/// code that cannot be read from the files.
fn check_kimi_family(file: &Path, config: &Map<String, Json>, model_config: Option<&Json>) -> Result<()> {
    let auto_map_kimi = config
        .get("auto_map")
        .and_then(|m| m.get("AutoTokenizer"))
        .and_then(Json::as_array)
        .is_some_and(|a| a.iter().filter_map(Json::as_str).any(|s| s.starts_with("tokenization_kimi.")));
    let model_type_kimi = model_config.is_some_and(|c| {
        let t = |v: &Json| v.get("model_type").and_then(Json::as_str).map(str::to_owned);
        [t(c), c.get("text_config").and_then(t)]
            .into_iter()
            .flatten()
            .any(|m| matches!(m.as_str(), "kimi_k2" | "kimi_k25" | "kimi_linear") || m.starts_with("kimi_k2"))
    });
    if auto_map_kimi || model_type_kimi {
        return Ok(());
    }
    Err(tok_err(
        file,
        "a tiktoken.model that is not of the Kimi family (tokenizer_config.json's auto_map names no \
         tokenization_kimi, config.json's model_type is not kimi_k2/kimi_k25): its split pattern lives \
         in the model's Python code, which aerie cannot read; provide a tokenizer.json",
    ))
}

/// The digest rule for tiktoken tokenizers: sha256 over `tiktoken.model`'s bytes, then one
/// `{id}\t{name}\n` line per special token in id order. Both decide the ids of a text, so both
/// are hashed; a capture engine in Python computes the same with `hashlib`.
pub fn tiktoken_digest(model_bytes: &[u8], specials: &[tiktoken::Special]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(model_bytes);
    for s in specials {
        h.update(format!("{}\t{}\n", s.id, s.content).as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// What [`measure`] reports: the tokenizer's load time and single-threaded encode throughput on
/// a list of texts, with a digest of all ids so that another implementation (python tiktoken,
/// `scripts/bench_tokenizer.py`) can be checked to produce the same ids on the same texts.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TokenizerMeasurement {
    /// The tokenizer file.
    pub file: PathBuf,
    /// `tiktoken` or `tokenizers`.
    pub kind: &'static str,
    /// Best of the loads: [`TokenizerFiles::load`] wall time, seconds.
    pub load_seconds: f64,
    /// Texts encoded.
    pub texts: usize,
    /// Their total length in code points.
    pub chars: usize,
    /// Total ids.
    pub tokens: usize,
    /// Best of the passes: wall time to encode all texts once, seconds.
    pub encode_seconds: f64,
    /// `tokens / encode_seconds`.
    pub tokens_per_second: f64,
    /// sha256 of all ids, each as little-endian u32, texts in order.
    pub ids_sha256: String,
}

/// Load the tokenizer at `path` `repeats` times and encode `texts` `repeats` times on this
/// thread, keeping the best time of each (the least disturbed by other work on the machine).
pub fn measure(path: &Path, texts: &[String], repeats: usize) -> Result<TokenizerMeasurement> {
    use sha2::{Digest, Sha256};
    let repeats = repeats.max(1);
    let mut load_seconds = f64::INFINITY;
    let mut tok = None;
    for _ in 0..repeats {
        let start = std::time::Instant::now();
        let t = TokenizerFiles::load(path)?;
        load_seconds = load_seconds.min(start.elapsed().as_secs_f64());
        tok = Some(t);
    }
    let tok = tok.expect("at least one load");
    let mut encode_seconds = f64::INFINITY;
    let mut digest = String::new();
    let mut tokens = 0;
    for _ in 0..repeats {
        let mut h = Sha256::new();
        let mut n = 0;
        let start = std::time::Instant::now();
        for text in texts {
            let enc =
                tok.tokenizer.encode(text, false).map_err(|e| tok_err(&tok.file(), format!("cannot encode: {e}")))?;
            n += enc.len();
            for id in enc.get_ids() {
                h.update(id.to_le_bytes());
            }
        }
        encode_seconds = encode_seconds.min(start.elapsed().as_secs_f64());
        tokens = n;
        digest = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    }
    Ok(TokenizerMeasurement {
        file: tok.file(),
        kind: match tok.tokenizer {
            TextTokenizer::Hf(_) => "tokenizers",
            TextTokenizer::Tiktoken(_) => "tiktoken",
        },
        load_seconds,
        texts: texts.len(),
        chars: texts.iter().map(|t| t.chars().count()).sum(),
        tokens,
        encode_seconds,
        tokens_per_second: tokens as f64 / encode_seconds,
        ids_sha256: digest,
    })
}

//! Dataset-wide metadata: what target produced the features, how they were taken, and what
//! teacher accompanies them. It travels as a string→string map (safetensors `__metadata__`
//! allows nothing else), identical in every shard and in `manifest.json`, so that any one shard
//! is self-describing and a trainer can refuse data captured from another target or tokenizer.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use super::encoding::{FORMAT_V2, HiddenDtype, INT4_GROUP};
use crate::{Error, MetadataError, Result};

/// The newest major format version this crate reads. It reads every major from 1 up to this one
/// and refuses the others.
pub const FORMAT_MAJOR: u32 = 2;

/// What [`format_is_supported`] accepts, for error messages.
pub(crate) const FORMATS_READ: &str = "aerie-shard/1 or aerie-shard/2";

const FORMAT_PREFIX: &str = "aerie-shard/";

/// Whether `format` is readable by this build (`aerie-shard/1`, `aerie-shard/1.3`,
/// `aerie-shard/2`, ...).
pub fn format_is_supported(format: &str) -> bool {
    format_major(format).is_some_and(|major| (1..=FORMAT_MAJOR).contains(&major))
}

/// The major version of an `aerie-shard/<major>[.<minor>]` string.
pub(crate) fn format_major(format: &str) -> Option<u32> {
    let version = format.strip_prefix(FORMAT_PREFIX)?;
    let major = version.split_once('.').map_or(version, |(major, _)| major);
    // Canonical decimals only, as everywhere in the metadata.
    major.parse::<u32>().ok().filter(|m| m.to_string() == major)
}

pub(crate) fn check_format(format: &str, path: &Path) -> Result<()> {
    if format_is_supported(format) {
        Ok(())
    } else {
        Err(Error::UnsupportedFormat { path: path.into(), found: format.into(), expected: FORMATS_READ })
    }
}

/// Which numbering aux-layer ids follow (eagle3.md §2). Mixing the two gives no error anywhere,
/// only a drafter with a low accept length, so every dataset states its convention and every id
/// list in aerie (shard `aux_layer_ids`, a drafter's aux layers) carries one. One type for both:
/// the shard metadata writes [`AuxConvention::as_str`], serde (drafter configs, training
/// configs) the same kebab-case spellings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuxConvention {
    /// "Output of layer i" (SpecForge, SGLang `eagle_config`): HF `output_hidden_states[i+1]`.
    OutputOfLayer,
    /// "Input of layer i" (vLLM, speculators, EAGLE repo): HF `output_hidden_states[i]`.
    InputOfLayer,
}

impl AuxConvention {
    /// The wire spelling: `output-of-layer` or `input-of-layer`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuxConvention::OutputOfLayer => "output-of-layer",
            AuxConvention::InputOfLayer => "input-of-layer",
        }
    }

    /// `ids` (in this convention) in the output-of-layer convention (SGLang's).
    pub fn output_of_layer(self, ids: &[usize]) -> Vec<usize> {
        match self {
            AuxConvention::OutputOfLayer => ids.to_vec(),
            AuxConvention::InputOfLayer => ids.iter().map(|&i| i.saturating_sub(1)).collect(),
        }
    }

    /// `ids` (in this convention) in the input-of-layer convention (speculators', vLLM's).
    pub fn input_of_layer(self, ids: &[usize]) -> Vec<usize> {
        match self {
            AuxConvention::OutputOfLayer => ids.iter().map(|&i| i + 1).collect(),
            AuxConvention::InputOfLayer => ids.to_vec(),
        }
    }
}

impl FromStr for AuxConvention {
    type Err = MetadataError;

    fn from_str(s: &str) -> std::result::Result<Self, MetadataError> {
        match s {
            "output-of-layer" => Ok(AuxConvention::OutputOfLayer),
            "input-of-layer" => Ok(AuxConvention::InputOfLayer),
            other => Err(MetadataError::new(
                "aux_convention",
                format!("`{other}` is neither `output-of-layer` nor `input-of-layer`"),
            )),
        }
    }
}

/// What the trainer distils from. The final hidden state lets the trainer compute full logits
/// through the target's lm_head; top-k log-probs are far smaller but truncate the distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Teacher {
    /// `final-hidden`: `final_hidden` [T, Ht] only.
    FinalHidden,
    /// `topk:K`: `teacher_topk_ids` and `teacher_topk_logprobs` [T, K] only.
    TopK {
        /// Entries kept per token.
        k: usize,
    },
    /// `final-hidden+topk:K`: both.
    Both {
        /// Entries kept per token.
        k: usize,
    },
}

impl Teacher {
    /// Whether shards carry `final_hidden`.
    pub fn has_final_hidden(self) -> bool {
        matches!(self, Teacher::FinalHidden | Teacher::Both { .. })
    }

    /// K when shards carry the top-k tensors.
    pub fn topk(self) -> Option<usize> {
        match self {
            Teacher::FinalHidden => None,
            Teacher::TopK { k } | Teacher::Both { k } => Some(k),
        }
    }
}

impl fmt::Display for Teacher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Teacher::FinalHidden => f.write_str("final-hidden"),
            Teacher::TopK { k } => write!(f, "topk:{k}"),
            Teacher::Both { k } => write!(f, "final-hidden+topk:{k}"),
        }
    }
}

impl FromStr for Teacher {
    type Err = MetadataError;

    fn from_str(s: &str) -> std::result::Result<Self, MetadataError> {
        let bad = || {
            MetadataError::new(
                "teacher",
                format!("`{s}` is not `final-hidden`, `topk:K` or `final-hidden+topk:K` (K a whole number, 1 or more)"),
            )
        };
        // Canonical decimal only (`topk:08` would compare unequal to `topk:8` as a string).
        let parse_k = |text: &str| match text.parse::<usize>() {
            Ok(k) if k > 0 && k.to_string() == text => Ok(k),
            _ => Err(bad()),
        };
        if s == "final-hidden" {
            Ok(Teacher::FinalHidden)
        } else if let Some(k) = s.strip_prefix("final-hidden+topk:") {
            Ok(Teacher::Both { k: parse_k(k)? })
        } else if let Some(k) = s.strip_prefix("topk:") {
            Ok(Teacher::TopK { k: parse_k(k)? })
        } else {
            Err(bad())
        }
    }
}

/// Everything a shard says about where its tensors came from. Identical across a dataset: the
/// reader refuses shards that disagree, because features from two targets (or two tokenizers)
/// cannot train one drafter.
///
/// Serialises as the string→string map stored in `__metadata__` and in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "BTreeMap<String, String>", into = "BTreeMap<String, String>")]
pub struct ShardMetadata {
    /// The target's `name_or_path`.
    pub target: String,
    /// Decoder layers of the target (N in eagle3.md §2).
    pub target_num_layers: usize,
    /// The target's full vocabulary size (V); token and top-k ids lie in `0..V`.
    pub target_vocab_size: usize,
    /// Captured layers, strictly increasing (low → high), in [`ShardMetadata::aux_convention`].
    pub aux_layer_ids: Vec<usize>,
    /// Numbering of `aux_layer_ids`.
    pub aux_convention: AuxConvention,
    /// The target hidden size (Ht).
    pub hidden_size: usize,
    /// Storage of `aux_hidden` and `final_hidden`: a plain float, or a scaled encoding that
    /// makes the dataset format 2.
    pub dtype: HiddenDtype,
    /// sha256 (lowercase hex) of the target's `tokenizer.json` (or `tiktoken.model` with its
    /// special-token table, [`crate::tokenizer::tiktoken_digest`]): token ids mean nothing without it.
    pub tokenizer_digest: String,
    /// Name or digest of the chat template applied before tokenising (`none` for raw text).
    pub chat_template: String,
    /// The teacher tensors every shard carries.
    pub teacher: Teacher,
    /// Free text naming the capture program and version.
    pub created_by: String,
    /// Further keys a producer added (a later minor format version, provenance). They are kept
    /// and must agree across the dataset like the others.
    pub extra: BTreeMap<String, String>,
}

const KEYS: [&str; 12] = [
    "format",
    "target",
    "target_num_layers",
    "target_vocab_size",
    "aux_layer_ids",
    "aux_convention",
    "hidden_size",
    "dtype",
    "tokenizer_digest",
    "chat_template",
    "teacher",
    "created_by",
];

impl ShardMetadata {
    /// Width of one `aux_hidden` row: captured layers × Ht.
    pub fn aux_width(&self) -> usize {
        self.aux_layer_ids.len() * self.hidden_size
    }

    /// Bytes one token occupies in a shard, to size `shard_tokens` against memory: the writer
    /// holds a whole shard in memory before writing it.
    pub fn bytes_per_token(&self) -> usize {
        let ht = self.hidden_size;
        let mut n = 4 + 1 + self.dtype.row_bytes_with_scales(self.aux_width(), ht);
        if self.teacher.has_final_hidden() {
            n += self.dtype.row_bytes_with_scales(ht, ht);
        }
        if let Some(k) = self.teacher.topk() {
            n += k * (4 + 4);
        }
        n
    }

    /// Check the values against each other (ids below the layer count, a well-formed digest,
    /// ...). Writers call this before writing anything; readers after parsing.
    pub fn validate(&self) -> std::result::Result<(), MetadataError> {
        fn err(key: &str, message: impl Into<String>) -> MetadataError {
            MetadataError::new(key, message)
        }
        if self.target.is_empty() {
            return Err(err("target", "is empty"));
        }
        if self.target_num_layers == 0 {
            return Err(err("target_num_layers", "must be positive"));
        }
        // Token ids are stored as int32.
        if self.target_vocab_size == 0 || self.target_vocab_size > i32::MAX as usize + 1 {
            return Err(err("target_vocab_size", "must be in 1..=2^31"));
        }
        if self.aux_layer_ids.is_empty() {
            return Err(err("aux_layer_ids", "is empty"));
        }
        if self.aux_layer_ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(err(
                "aux_layer_ids",
                format!("{:?} is not strictly increasing (low → high)", self.aux_layer_ids),
            ));
        }
        if let Some(&id) = self.aux_layer_ids.iter().find(|&&id| id >= self.target_num_layers) {
            return Err(err(
                "aux_layer_ids",
                format!("layer {id} does not exist in a target with {} layers", self.target_num_layers),
            ));
        }
        if self.hidden_size == 0 {
            return Err(err("hidden_size", "must be positive"));
        }
        if self.dtype == HiddenDtype::Int4 && !self.hidden_size.is_multiple_of(INT4_GROUP) {
            return Err(err(
                "dtype",
                format!(
                    "int4 stores a scale per {INT4_GROUP} values of a layer, so hidden_size must be a multiple of {INT4_GROUP} (it is {})",
                    self.hidden_size
                ),
            ));
        }
        // Row sizes in bytes must be computable (8 = the widest element) without overflow.
        if self.aux_layer_ids.len().checked_mul(self.hidden_size).and_then(|w| w.checked_mul(8)).is_none() {
            return Err(err("hidden_size", "is too large"));
        }
        let digest_ok = self.tokenizer_digest.len() == 64
            && self.tokenizer_digest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !digest_ok {
            return Err(err("tokenizer_digest", format!("`{}` is not a lowercase hex sha256", self.tokenizer_digest)));
        }
        if self.chat_template.is_empty() {
            return Err(err("chat_template", "is empty (write `none` for raw text)"));
        }
        if let Some(k) = self.teacher.topk()
            && (k == 0 || k > self.target_vocab_size)
        {
            return Err(err("teacher", format!("K = {k} is outside 1..=target_vocab_size")));
        }
        if let Some(key) = self.extra.keys().find(|k| KEYS.contains(&k.as_str())) {
            return Err(err(key, "standard key given again in `extra`"));
        }
        Ok(())
    }

    /// The wire form, `format` included.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut map = self.extra.clone();
        let ids = serde_json::to_string(&self.aux_layer_ids).unwrap_or_default();
        let entries = [
            ("format", self.dtype.format().to_string()),
            ("target", self.target.clone()),
            ("target_num_layers", self.target_num_layers.to_string()),
            ("target_vocab_size", self.target_vocab_size.to_string()),
            ("aux_layer_ids", ids),
            ("aux_convention", self.aux_convention.as_str().into()),
            ("hidden_size", self.hidden_size.to_string()),
            ("dtype", self.dtype.as_str().into()),
            ("tokenizer_digest", self.tokenizer_digest.clone()),
            ("chat_template", self.chat_template.clone()),
            ("teacher", self.teacher.to_string()),
            ("created_by", self.created_by.clone()),
        ];
        for (key, value) in entries {
            map.insert(key.into(), value);
        }
        map
    }

    /// Parse and [`validate`](Self::validate) the wire form. `format` must be present and of
    /// the supported major version; unknown keys land in [`ShardMetadata::extra`].
    pub fn from_map(map: &BTreeMap<String, String>) -> std::result::Result<Self, MetadataError> {
        let get = |key: &str| map.get(key).map(String::as_str).ok_or_else(|| MetadataError::new(key, "missing"));
        let number = |key: &str| -> std::result::Result<usize, MetadataError> {
            let value = get(key)?;
            value.parse::<usize>().map_err(|_| MetadataError::new(key, format!("`{value}` is not an integer")))
        };
        let format = get("format")?;
        if !format_is_supported(format) {
            return Err(MetadataError::new("format", format!("`{format}` is not {FORMATS_READ}")));
        }
        let ids = get("aux_layer_ids")?;
        let aux_layer_ids = serde_json::from_str::<Vec<usize>>(ids)
            .map_err(|_| MetadataError::new("aux_layer_ids", format!("`{ids}` is not a JSON list of layer ids")))?;
        let metadata = ShardMetadata {
            target: get("target")?.into(),
            target_num_layers: number("target_num_layers")?,
            target_vocab_size: number("target_vocab_size")?,
            aux_layer_ids,
            aux_convention: get("aux_convention")?.parse()?,
            hidden_size: number("hidden_size")?,
            dtype: get("dtype")?.parse()?,
            tokenizer_digest: get("tokenizer_digest")?.into(),
            chat_template: get("chat_template")?.into(),
            teacher: get("teacher")?.parse()?,
            created_by: get("created_by")?.into(),
            extra: map
                .iter()
                .filter(|(k, _)| !KEYS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        metadata.validate()?;
        // A scaled encoding declared under format 1 would be misread by every format-1 reader.
        if metadata.dtype.is_scaled() && format_major(format) == Some(1) {
            return Err(MetadataError::new(
                "format",
                format!("`{format}` cannot hold dtype `{}`: scaled encodings need {FORMAT_V2}", metadata.dtype),
            ));
        }
        Ok(metadata)
    }

    /// The keys on which `self` and `reference` disagree, one line each
    /// (`hidden_size: 4096 vs 7168`), compared in canonical wire form so that spelling
    /// differences (`[1,2]` vs `[1, 2]`) do not count. Empty when they agree.
    pub fn differences(&self, reference: &ShardMetadata) -> Vec<String> {
        let (mine, theirs) = (self.to_map(), reference.to_map());
        let keys: std::collections::BTreeSet<&String> = mine.keys().chain(theirs.keys()).collect();
        let show = |v: Option<&String>| v.map_or("(absent)".to_string(), |v| format!("`{v}`"));
        keys.into_iter()
            .filter(|k| k.as_str() != "format" && mine.get(*k) != theirs.get(*k))
            .map(|k| format!("{k}: {} vs {}", show(mine.get(k)), show(theirs.get(k))))
            .collect()
    }
}

impl TryFrom<BTreeMap<String, String>> for ShardMetadata {
    type Error = MetadataError;

    fn try_from(map: BTreeMap<String, String>) -> std::result::Result<Self, MetadataError> {
        Self::from_map(&map)
    }
}

impl From<ShardMetadata> for BTreeMap<String, String> {
    fn from(metadata: ShardMetadata) -> Self {
        metadata.to_map()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::shard::encoding::FORMAT;

    pub(crate) fn sample_metadata() -> ShardMetadata {
        ShardMetadata {
            target: "meta-llama/Llama-3.1-8B-Instruct".into(),
            target_num_layers: 32,
            target_vocab_size: 128_256,
            aux_layer_ids: vec![1, 15, 28],
            aux_convention: AuxConvention::OutputOfLayer,
            hidden_size: 4096,
            dtype: HiddenDtype::BF16,
            tokenizer_digest: "ab".repeat(32),
            chat_template: "llama3".into(),
            teacher: Teacher::Both { k: 20 },
            created_by: "aerie-data tests".into(),
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn map_round_trip_keeps_extra_keys() {
        let mut m = sample_metadata();
        m.extra.insert("capture_max_len".into(), "2048".into());
        let map = m.to_map();
        assert_eq!(map["format"], FORMAT);
        assert_eq!(map["aux_layer_ids"], "[1,15,28]");
        assert_eq!(map["teacher"], "final-hidden+topk:20");
        assert_eq!(ShardMetadata::from_map(&map).unwrap(), m);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<ShardMetadata>(&json).unwrap(), m);
    }

    #[test]
    fn list_spelling_does_not_matter() {
        let m = sample_metadata();
        let mut map = m.to_map();
        map.insert("aux_layer_ids".into(), "[1, 15, 28]".into());
        assert!(ShardMetadata::from_map(&map).unwrap().differences(&m).is_empty());
    }

    #[test]
    fn formats() {
        assert!(format_is_supported("aerie-shard/1"));
        assert!(format_is_supported("aerie-shard/1.2"));
        assert!(format_is_supported("aerie-shard/2"));
        assert!(!format_is_supported("aerie-shard/3"));
        assert!(!format_is_supported("aerie-shard/02"));
        assert!(!format_is_supported("aerie-shard/10"));
        assert!(!format_is_supported("other/1"));
    }

    #[test]
    fn scaled_encodings_declare_format_2() {
        let mut m = sample_metadata();
        m.dtype = HiddenDtype::Fp8E4m3;
        let mut map = m.to_map();
        assert_eq!(map["format"], FORMAT_V2);
        assert_eq!(map["dtype"], "fp8-e4m3");
        assert_eq!(ShardMetadata::from_map(&map).unwrap(), m);
        map.insert("format".into(), FORMAT.into());
        let e = ShardMetadata::from_map(&map).unwrap_err();
        assert_eq!(e.key, "format");
        assert!(e.message.contains("need aerie-shard/2"), "{e}");
        // 3 × 4096 fp8 values + 3 scales; final hidden 4096 + 1 scale; top-20.
        assert_eq!(m.bytes_per_token(), 5 + 3 * 4096 + 12 + 4096 + 4 + 160);
        m.dtype = HiddenDtype::Int4;
        m.hidden_size = 4100;
        assert_eq!(m.validate().unwrap_err().key, "dtype");
    }

    #[test]
    fn teacher_spellings() {
        for t in [Teacher::FinalHidden, Teacher::TopK { k: 8 }, Teacher::Both { k: 64 }] {
            assert_eq!(t.to_string().parse::<Teacher>().unwrap(), t);
        }
        for bad in ["topk:0", "topk:", "topk:+3", "topk:03", "both", "final_hidden"] {
            assert!(bad.parse::<Teacher>().is_err(), "{bad}");
        }
    }

    #[test]
    fn validation_names_the_key() {
        type Edit = fn(&mut ShardMetadata);
        let cases: Vec<(&str, Edit)> = vec![
            ("tokenizer_digest", |m| m.tokenizer_digest = "AB".repeat(32)),
            ("aux_layer_ids", |m| m.aux_layer_ids = vec![3, 2]),
            ("aux_layer_ids", |m| m.aux_layer_ids = vec![1, 32]),
            ("aux_layer_ids", |m| m.aux_layer_ids.clear()),
            ("hidden_size", |m| m.hidden_size = 0),
            ("teacher", |m| m.teacher = Teacher::TopK { k: 200_000 }),
            ("chat_template", |m| m.chat_template.clear()),
            ("dtype", |m| {
                m.extra.insert("dtype".into(), "f32".into());
            }),
        ];
        for (key, edit) in cases {
            let mut m = sample_metadata();
            edit(&mut m);
            assert_eq!(m.validate().unwrap_err().key, key);
        }
        let mut map = sample_metadata().to_map();
        map.remove("created_by");
        assert_eq!(ShardMetadata::from_map(&map).unwrap_err().key, "created_by");
        map.insert("created_by".into(), "x".into());
        map.insert("hidden_size".into(), "4k".into());
        assert_eq!(ShardMetadata::from_map(&map).unwrap_err().key, "hidden_size");
    }
}

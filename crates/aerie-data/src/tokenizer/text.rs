//! One tokenizer interface over the two families aerie reads: a Hugging Face `tokenizers`
//! pipeline (`tokenizer.json`) and Kimi's tiktoken BPE. Callers (the chat encoder, generation,
//! regenerate) only encode with byte offsets, decode and look up token names, so that is all
//! this type offers.

use tokenizers::Tokenizer;

use super::tiktoken::Tiktoken;

/// A loaded tokenizer.
pub enum TextTokenizer {
    /// `tokenizer.json`.
    Hf(Box<Tokenizer>),
    /// `tiktoken.model` of the Kimi family.
    Tiktoken(Box<Tiktoken>),
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hf(_) => f.write_str("TextTokenizer::Hf"),
            Self::Tiktoken(t) => write!(f, "TextTokenizer::{t:?}"),
        }
    }
}

/// Token ids of a text with the byte range each covers in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    ids: Vec<u32>,
    offsets: Vec<(usize, usize)>,
}

impl Encoded {
    /// The ids.
    pub fn get_ids(&self) -> &[u32] {
        &self.ids
    }

    /// Byte range of each id in the encoded text.
    pub fn get_offsets(&self) -> &[(usize, usize)] {
        &self.offsets
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// No tokens.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// An added (special) token: what the chat encoder needs to find end-of-turn tokens and clean
/// split points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedToken {
    /// Its text.
    pub content: String,
    /// Its id.
    pub id: u32,
    /// A special token (`<|im_end|>`), not an added word.
    pub special: bool,
    /// The tokenizer splits text at it exactly, whatever surrounds it (no whitespace stripping,
    /// no normalisation), so the tokens before it do not depend on what follows.
    pub splits_cleanly: bool,
}

impl TextTokenizer {
    /// Encode `text` (`add_special_tokens`: the pipeline's BOS/EOS post-processor, for
    /// `tokenizer.json`; Kimi's tokenizer never adds any).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> tokenizers::Result<Encoded> {
        match self {
            Self::Hf(t) => {
                let enc = t.encode(text, add_special_tokens)?;
                Ok(Encoded { ids: enc.get_ids().to_vec(), offsets: enc.get_offsets().to_vec() })
            }
            Self::Tiktoken(t) => {
                let (ids, offsets) = t.encode_with_offsets(text);
                Ok(Encoded { ids, offsets })
            }
        }
    }

    /// Decode `ids` to text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> tokenizers::Result<String> {
        match self {
            Self::Hf(t) => t.decode(ids, skip_special_tokens),
            Self::Tiktoken(t) => t.decode(ids, skip_special_tokens).map_err(Into::into),
        }
    }

    /// The id of a token given by its text (a special's name, or a vocabulary entry).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match self {
            Self::Hf(t) => t.token_to_id(token),
            Self::Tiktoken(t) => t.token_to_id(token),
        }
    }

    /// The text of one token as it appears in decoded output (invalid UTF-8 of a partial
    /// character replaced), for displays such as `aerie data show`.
    pub fn token_text(&self, id: u32) -> Option<String> {
        match self {
            Self::Hf(t) => t.decode(&[id], false).ok(),
            Self::Tiktoken(t) => t.token_bytes(id).map(|b| String::from_utf8_lossy(b).into_owned()),
        }
    }

    /// Largest id + 1, added tokens included.
    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Hf(t) => t.get_vocab(true).values().max().map_or(0, |&m| m as usize + 1),
            Self::Tiktoken(t) => t.vocab_size(),
        }
    }

    /// The added tokens, in id order.
    pub fn added_tokens(&self) -> Vec<AddedToken> {
        let mut out: Vec<AddedToken> = match self {
            Self::Hf(t) => t
                .get_added_tokens_decoder()
                .into_iter()
                .map(|(id, a)| AddedToken {
                    splits_cleanly: a.special && !a.lstrip && !a.rstrip && !a.normalized && !a.content.is_empty(),
                    content: a.content,
                    id,
                    special: a.special,
                })
                .collect(),
            // tiktoken matches every special name in the text before splitting, so all 256
            // are special and split cleanly (the tool-call markers too, whatever their
            // `special: false` in the config says about decoding).
            Self::Tiktoken(t) => t
                .specials()
                .iter()
                .map(|s| AddedToken { content: s.content.clone(), id: s.id, special: true, splits_cleanly: true })
                .collect(),
        };
        out.sort_unstable_by_key(|a| a.id);
        out
    }
}

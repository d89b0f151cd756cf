//! Kimi's tiktoken tokenizer (`tiktoken.model` + `tokenization_kimi.py`), reimplemented so that
//! its ids equal python tiktoken's exactly (`../shared/reference/kimi-tokenizer.md` §2).
//!
//! Why not convert to a `tokenizers` BPE: tiktoken's merge rule (repeatedly join the adjacent
//! pair whose concatenation has the lowest rank) needs no merges list, loads in a fraction of
//! the time a 163,584-entry HF BPE with its derived merges takes, and is the reference itself;
//! a conversion would have to be proven equal to it. The split regex is compiled with
//! fancy-regex, the engine python tiktoken compiles it with, so its semantics (class
//! intersection `&&`, the `\s+(?!\S)` lookahead) are the reference's by construction.
//!
//! What `tokenization_kimi.py`'s `encode` does, and this module does too:
//! 1. the text is cut into chunks of 400,000 code points;
//! 2. inside each chunk, runs of whitespace or non-whitespace (Python `str.isspace`, which is
//!    Unicode White_Space plus U+001C..U+001F) longer than 25,000 code points are cut: a new
//!    piece starts at the 25,001st character of a run;
//! 3. each piece is encoded with `allowed_special="all"`: every special-token name written in
//!    the text is that special token, and the regex restarts after it and at each piece edge.
//!
//! No normaliser, no BOS/EOS. Byte offsets of every token are kept (pieces shifted to their
//! place in the text), because the loss-mask code maps template spans to tokens with them.

use std::collections::HashMap;
use std::path::Path;

use aho_corasick::{AhoCorasick, MatchKind};
use fancy_regex::Regex;
use rustc_hash::FxHashMap;
use serde_json::{Map, Value as Json};

use crate::{Error, Result};

/// Kimi's split pattern, byte for byte as `tokenization_kimi.py` joins it with `|`
/// (sha256 `de5781783b193d5ccf5b1b28edfa70fa816ce78d54603fdc422cfd8d4ea4411f`).
pub const KIMI_PAT_STR: &str = concat!(
    r"[\p{Han}]+",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    "|",
    r"\s*[\r\n]+",
    "|",
    r"\s+(?!\S)",
    "|",
    r"\s+",
);

/// Number of special-token ids after the ranks (`range(n, n + 256)` in `tokenization_kimi.py`).
pub const NUM_SPECIAL: usize = 256;
/// `TIKTOKEN_MAX_ENCODE_CHARS` of `tokenization_kimi.py` (code points).
const MAX_ENCODE_CHARS: usize = 400_000;
/// `MAX_NO_WHITESPACES_CHARS` of `tokenization_kimi.py` (code points).
const MAX_RUN_CHARS: usize = 25_000;

/// One special token: `added_tokens_decoder`'s name, or `<|reserved_token_{id}|>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Special {
    /// The name, as written in text.
    pub content: String,
    /// Its id (`n + offset`).
    pub id: u32,
    /// `special` of its `added_tokens_decoder` entry (true for reserved names): whether
    /// `decode(skip_special_tokens=True)` drops it. The tool-call markers are `false`.
    pub skip_on_decode: bool,
}

/// A loaded Kimi-family tiktoken tokenizer.
pub struct Tiktoken {
    encoder: FxHashMap<Vec<u8>, u32>,
    /// Token bytes by rank.
    decoder: Vec<Vec<u8>>,
    specials: Vec<Special>,
    special_by_name: HashMap<String, u32>,
    special_matcher: AhoCorasick,
    regex: Regex,
}

impl std::fmt::Debug for Tiktoken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiktoken").field("ranks", &self.decoder.len()).finish_non_exhaustive()
    }
}

fn err(path: &Path, message: impl Into<String>) -> Error {
    Error::Tokenizer { path: path.to_owned(), message: message.into() }
}

/// Strict standard base64 (RFC 4648, `=` padding), as python's `base64.b64decode` accepts
/// what tiktoken files hold.
fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    if s.is_empty() || !s.len().is_multiple_of(4) {
        return None;
    }
    let pad = s.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for (q, chunk) in s.chunks(4).enumerate() {
        let last = q == s.len() / 4 - 1;
        let mut acc = 0u32;
        let mut n = 0;
        for &c in chunk {
            if c == b'=' {
                if !last {
                    return None;
                }
                acc <<= 6;
                continue;
            }
            acc = (acc << 6) | val(c)?;
            n += 1;
        }
        let bytes = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        let keep = match n {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        out.extend_from_slice(&bytes[..keep]);
    }
    Some(out)
}

/// Python `str.isspace`: Unicode White_Space plus the four separators U+001C..U+001F
/// (checked over all code points against CPython; Rust's `char::is_whitespace` lacks them).
pub fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Byte ranges of the pieces `tokenization_kimi.py` encodes separately: 400,000-code-point
/// chunks, each cut where a whitespace or non-whitespace run passes 25,000 code points.
pub fn kimi_pieces(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut rest = text.char_indices().peekable();
    while let Some(&(chunk_start, first)) = rest.peek() {
        let mut cur_space = py_isspace(first);
        let mut cur_len = 0usize;
        let mut slice_start = chunk_start;
        let mut chunk_end = text.len();
        for k in 0..MAX_ENCODE_CHARS {
            let Some((b, c)) = rest.next() else { break };
            let now = py_isspace(c);
            if cur_space != now {
                cur_len = 1;
                cur_space = now;
            } else {
                cur_len += 1;
                if cur_len > MAX_RUN_CHARS {
                    out.push((slice_start, b));
                    slice_start = b;
                    cur_len = 1;
                }
            }
            if k + 1 == MAX_ENCODE_CHARS {
                chunk_end = rest.peek().map_or(text.len(), |&(b, _)| b);
            }
        }
        out.push((slice_start, chunk_end));
    }
    out
}

impl Tiktoken {
    /// Load `tiktoken.model` (lines `base64(bytes) rank`, ranks exactly 0..n-1, all 256 single
    /// bytes present) and name the 256 specials after it from `config`'s `added_tokens_decoder`.
    pub fn load(model: &Path, config: &Map<String, Json>) -> Result<Self> {
        let bytes = std::fs::read(model).map_err(|e| Error::io(model, e))?;
        Self::from_bytes(model, &bytes, config)
    }

    /// [`Tiktoken::load`] on the file's bytes (`path` names it in errors).
    pub fn from_bytes(path: &Path, bytes: &[u8], config: &Map<String, Json>) -> Result<Self> {
        // Ranks are exactly 0..n-1 for the n entries the file has: the table is sized by the
        // file, never by a rank it claims (one line `... 4000000000` must not allocate 96 GB).
        let lines = || bytes.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        let n_entries = lines().filter(|l| !l.is_empty()).count();
        let mut decoder: Vec<Option<Vec<u8>>> = vec![None; n_entries];
        let mut encoder: FxHashMap<Vec<u8>, u32> = FxHashMap::default();
        encoder.reserve(n_entries);
        let mut out_of_range: Option<(usize, u32)> = None;
        for (lineno, line) in lines().enumerate() {
            if line.is_empty() {
                continue;
            }
            let bad = |what: &str| err(path, format!("line {}: {what}", lineno + 1));
            let mut parts = line.split(|&b| b == b' ').filter(|p| !p.is_empty());
            let (Some(tok), Some(rank), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad("expected `base64 rank`"));
            };
            let tok = base64_decode(tok).ok_or_else(|| bad("the token is not valid base64"))?;
            let rank: u32 = std::str::from_utf8(rank)
                .ok()
                .and_then(|r| r.parse().ok())
                .ok_or_else(|| bad("the rank is not a non-negative integer"))?;
            let r = rank as usize;
            if r >= n_entries {
                // Not stored (nothing is allocated for it); reported below with the rank it
                // leaves missing.
                out_of_range.get_or_insert((lineno + 1, rank));
                continue;
            }
            if decoder[r].is_some() {
                return Err(bad(&format!("rank {rank} appears twice")));
            }
            if encoder.insert(tok.clone(), rank).is_some() {
                return Err(bad("the same token bytes appear twice"));
            }
            decoder[r] = Some(tok);
        }
        if let Some((line, rank)) = out_of_range {
            let missing = decoder.iter().position(Option::is_none).unwrap_or(0);
            return Err(err(
                path,
                format!(
                    "line {line}: rank {rank} is out of range: the file has {n_entries} entries, so ranks must be \
                     0..{} (rank {missing} is missing)",
                    n_entries - 1
                ),
            ));
        }
        let decoder: Vec<Vec<u8>> = decoder
            .into_iter()
            .enumerate()
            .map(|(r, t)| t.ok_or_else(|| err(path, format!("rank {r} is missing (ranks must be 0..n-1)"))))
            .collect::<Result<_>>()?;
        if let Some(b) = (0..=255u8).find(|b| !encoder.contains_key(&[*b][..])) {
            return Err(err(path, format!("the single byte 0x{b:02x} has no rank: not a byte-level BPE")));
        }
        let n = decoder.len();
        let names = config.get("added_tokens_decoder").and_then(Json::as_object);
        let specials: Vec<Special> = (n..n + NUM_SPECIAL)
            .map(|id| {
                let entry = names.and_then(|m| m.get(&id.to_string()));
                let content = entry
                    .and_then(|e| e.get("content"))
                    .and_then(Json::as_str)
                    .map_or_else(|| format!("<|reserved_token_{id}|>"), str::to_owned);
                let skip_on_decode = entry.and_then(|e| e.get("special")).and_then(Json::as_bool).unwrap_or(true);
                Special { content, id: id as u32, skip_on_decode }
            })
            .collect();
        let mut special_by_name: HashMap<String, u32> = HashMap::with_capacity(NUM_SPECIAL);
        for s in &specials {
            if let Some(first) = special_by_name.insert(s.content.clone(), s.id) {
                // The names come from the config beside the model, not from the model file.
                return Err(err(
                    &path.with_file_name("tokenizer_config.json"),
                    format!("added_tokens_decoder names ids {first} and {} both `{}`", s.id, s.content),
                ));
            }
        }
        let special_matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(specials.iter().map(|s| s.content.as_str()))
            .map_err(|e| err(path, format!("cannot build the special-token matcher: {e}")))?;
        let regex = Regex::new(KIMI_PAT_STR).map_err(|e| err(path, format!("cannot compile Kimi's pat_str: {e}")))?;
        Ok(Self { encoder, decoder, specials, special_by_name, special_matcher, regex })
    }

    /// Number of BPE ranks (`n`; specials are `n..n+256`).
    pub fn num_ranks(&self) -> usize {
        self.decoder.len()
    }

    /// Largest id + 1.
    pub fn vocab_size(&self) -> usize {
        self.decoder.len() + NUM_SPECIAL
    }

    /// The 256 special tokens in id order.
    pub fn specials(&self) -> &[Special] {
        &self.specials
    }

    /// The id of a token given as its text: a special name, or a rank whose bytes are that
    /// UTF-8 text.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.special_by_name.get(token).copied().or_else(|| self.encoder.get(token.as_bytes()).copied())
    }

    /// The bytes of token `id` (a special's name for specials).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if i < self.decoder.len() {
            Some(&self.decoder[i])
        } else {
            self.specials.get(i - self.decoder.len()).map(|s| s.content.as_bytes())
        }
    }

    /// `tokenization_kimi.py`'s `encode(text)`: ids and the byte range of each in `text`.
    pub fn encode_with_offsets(&self, text: &str) -> (Vec<u32>, Vec<(usize, usize)>) {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        let mut offsets = Vec::with_capacity(text.len() / 3 + 1);
        for (start, end) in kimi_pieces(text) {
            self.encode_ordinary_piece_with_specials(text, start, end, &mut ids, &mut offsets);
        }
        (ids, offsets)
    }

    /// `Encoding.encode(text[start..end], allowed_special="all")`.
    fn encode_ordinary_piece_with_specials(
        &self,
        text: &str,
        start: usize,
        end: usize,
        ids: &mut Vec<u32>,
        offsets: &mut Vec<(usize, usize)>,
    ) {
        let piece = &text[start..end];
        let mut at = 0;
        for m in self.special_matcher.find_iter(piece) {
            self.encode_ordinary(piece, at, m.start(), start, ids, offsets);
            ids.push(self.specials[m.pattern().as_usize()].id);
            offsets.push((start + m.start(), start + m.end()));
            at = m.end();
        }
        self.encode_ordinary(piece, at, piece.len(), start, ids, offsets);
    }

    /// The regex split and BPE of `s[from..to]` (no specials in it); offsets shifted by `base`.
    fn encode_ordinary(
        &self,
        s: &str,
        from: usize,
        to: usize,
        base: usize,
        ids: &mut Vec<u32>,
        offsets: &mut Vec<(usize, usize)>,
    ) {
        let seg = &s[from..to];
        for m in self.regex.find_iter(seg) {
            // fancy-regex reports an error only when its backtrack limit is hit; tiktoken
            // unwraps the same call, so a panic-free port falls back to the whole rest.
            let (ms, me) = match m {
                Ok(m) => (m.start(), m.end()),
                Err(_) => (0, seg.len()),
            };
            let bytes = &seg.as_bytes()[ms..me];
            let off = base + from + ms;
            if let Some(&id) = self.encoder.get(bytes) {
                ids.push(id);
                offsets.push((off, off + bytes.len()));
                continue;
            }
            let parts = if bytes.len() < LONG_PIECE {
                byte_pair_merge(&self.encoder, bytes)
            } else {
                byte_pair_merge_long(&self.encoder, bytes)
            };
            for w in parts.windows(2) {
                let (a, b) = (w[0].0, w[1].0);
                ids.push(self.encoder[&bytes[a..b]]);
                offsets.push((off + a, off + b));
            }
        }
    }

    /// The text of `ids` (invalid UTF-8 replaced, as Kimi's `decode` does); with `skip_special`
    /// the specials whose config entry says `special: true` are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> std::result::Result<String, String> {
        let mut bytes = Vec::new();
        let n = self.decoder.len();
        for &id in ids {
            let i = id as usize;
            if i < n {
                bytes.extend_from_slice(&self.decoder[i]);
            } else if let Some(s) = self.specials.get(i - n) {
                if !(skip_special && s.skip_on_decode) {
                    bytes.extend_from_slice(s.content.as_bytes());
                }
            } else {
                return Err(format!("token id {id} is outside the vocabulary of {}", self.vocab_size()));
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Pieces at least this long merge with [`byte_pair_merge_long`]: tiktoken's scan is
/// quadratic in the piece length, and the pieces Kimi allows run to 25,000 characters.
const LONG_PIECE: usize = 256;

/// tiktoken's `_byte_pair_merge`: the part boundaries of `piece` after repeatedly merging the
/// adjacent pair whose concatenation has the lowest rank (leftmost on ties).
fn byte_pair_merge(ranks: &FxHashMap<Vec<u8>, u32>, piece: &[u8]) -> Vec<(usize, u32)> {
    let mut parts: Vec<(usize, u32)> = Vec::with_capacity(piece.len() + 1);
    let mut min_rank = (u32::MAX, usize::MAX);
    for i in 0..piece.len() - 1 {
        let rank = *ranks.get(&piece[i..i + 2]).unwrap_or(&u32::MAX);
        if rank < min_rank.0 {
            min_rank = (rank, i);
        }
        parts.push((i, rank));
    }
    parts.push((piece.len() - 1, u32::MAX));
    parts.push((piece.len(), u32::MAX));
    let get_rank = |parts: &Vec<(usize, u32)>, i: usize| {
        if i + 3 < parts.len() { *ranks.get(&piece[parts[i].0..parts[i + 3].0]).unwrap_or(&u32::MAX) } else { u32::MAX }
    };
    while min_rank.0 != u32::MAX {
        let i = min_rank.1;
        if i > 0 {
            parts[i - 1].1 = get_rank(&parts, i - 1);
        }
        parts[i].1 = get_rank(&parts, i);
        parts.remove(i + 1);
        min_rank = (u32::MAX, usize::MAX);
        for (i, &(_, rank)) in parts[..parts.len() - 1].iter().enumerate() {
            if rank < min_rank.0 {
                min_rank = (rank, i);
            }
        }
    }
    parts
}

/// The same merges as [`byte_pair_merge`] in O(n log n): a min-heap of (rank, start) with
/// stale entries skipped gives the lowest rank, leftmost on ties, at every step, which is the
/// rule the linear scan applies; the parts are a linked list over byte positions.
fn byte_pair_merge_long(ranks: &FxHashMap<Vec<u8>, u32>, piece: &[u8]) -> Vec<(usize, u32)> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let n = piece.len();
    // next[p] / prev[p]: neighbouring part starts (n is the end sentinel).
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|p| p.wrapping_sub(1)).collect();
    let mut alive = vec![true; n];
    let mut rank_at = vec![u32::MAX; n];
    let pair_rank = |next: &[usize], p: usize| -> u32 {
        let q = next[p];
        if q >= n {
            return u32::MAX;
        }
        let end = next[q];
        *ranks.get(&piece[p..end]).unwrap_or(&u32::MAX)
    };
    let mut heap = BinaryHeap::with_capacity(n);
    for (p, r) in rank_at.iter_mut().enumerate() {
        *r = pair_rank(&next, p);
        if *r != u32::MAX {
            heap.push(Reverse((*r, p)));
        }
    }
    while let Some(Reverse((r, p))) = heap.pop() {
        if !alive[p] || rank_at[p] != r {
            continue;
        }
        let q = next[p];
        alive[q] = false;
        next[p] = next[q];
        if next[q] < n {
            prev[next[q]] = p;
        }
        rank_at[p] = pair_rank(&next, p);
        if rank_at[p] != u32::MAX {
            heap.push(Reverse((rank_at[p], p)));
        }
        let before = prev[p];
        if before < n {
            rank_at[before] = pair_rank(&next, before);
            if rank_at[before] != u32::MAX {
                heap.push(Reverse((rank_at[before], before)));
            }
        }
    }
    let mut parts = Vec::new();
    let mut p = 0;
    while p < n {
        parts.push((p, rank_at[p]));
        p = next[p];
    }
    parts.push((n, u32::MAX));
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (enc, dec) in [("Zg==", "f"), ("Zm8=", "fo"), ("Zm9v", "foo"), ("Zm9vYg==", "foob"), ("Zm9vYmFy", "foobar")]
        {
            assert_eq!(base64_decode(enc.as_bytes()).unwrap(), dec.as_bytes(), "{enc}");
        }
        for bad in ["", "Zg=", "Z===", "Zg==Zg==", "Zm9*"] {
            assert!(base64_decode(bad.as_bytes()).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_heap_merge_makes_the_same_parts_as_tiktokens_scan() {
        // ranks: the 256 bytes, then pairs and triples chosen so that ties and chains occur.
        let mut ranks: FxHashMap<Vec<u8>, u32> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        for (i, t) in ["ab", "ba", "aa", "abab", "aab", "bb", "abb", "aaaa", "ba ", " a"].iter().enumerate() {
            ranks.insert(t.as_bytes().to_vec(), 256 + i as u32);
        }
        let mut state = 7u64;
        for len in 2..400 {
            let piece: Vec<u8> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    b"ab a"[(state >> 60) as usize % 4]
                })
                .collect();
            let bounds = |v: Vec<(usize, u32)>| v.into_iter().map(|(p, _)| p).collect::<Vec<_>>();
            assert_eq!(bounds(byte_pair_merge(&ranks, &piece)), bounds(byte_pair_merge_long(&ranks, &piece)), "{len}");
        }
    }

    /// The 256 single bytes as `base64 rank` lines, then `extra`.
    fn model_file(extra: &str) -> Vec<u8> {
        const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut text: String = (0..=255u8)
            .map(|b| format!("{}{}== {b}\n", B64[(b >> 2) as usize] as char, B64[((b & 3) << 4) as usize] as char))
            .collect();
        text.push_str(extra);
        text.into_bytes()
    }

    #[test]
    fn a_rank_beyond_the_files_entries_is_refused_naming_the_line_before_any_allocation() {
        let path = Path::new("tiktoken.model");
        let config = Map::new();
        assert_eq!(Tiktoken::from_bytes(path, &model_file("YWI= 256\n"), &config).unwrap().num_ranks(), 257);
        for rank in ["4000000000", "300000000", "257"] {
            let started = std::time::Instant::now();
            let err =
                Tiktoken::from_bytes(path, &model_file(&format!("YWI= {rank}\n")), &config).unwrap_err().to_string();
            assert!(
                err.contains("tiktoken.model")
                    && err.contains("line 257")
                    && err.contains(&format!("rank {rank} is out of range")),
                "{err}"
            );
            assert!(started.elapsed().as_secs_f64() < 1.0, "rank {rank}: {:?}", started.elapsed());
        }
    }

    #[test]
    fn a_duplicate_special_name_is_blamed_on_the_config_naming_both_ids() {
        let config: Map<String, Json> = serde_json::from_str(
            r#"{"added_tokens_decoder": {"256": {"content": "<|x|>"}, "300": {"content": "<|x|>"}}}"#,
        )
        .unwrap();
        let path = Path::new("/m/tiktoken.model");
        let err = Tiktoken::from_bytes(path, &model_file(""), &config).unwrap_err().to_string();
        assert!(err.starts_with("/m/tokenizer_config.json: "), "{err}");
        assert!(err.contains("ids 256 and 300") && err.contains("`<|x|>`"), "{err}");
    }

    #[test]
    fn pat_str_is_kimis_byte_for_byte() {
        use sha2::{Digest, Sha256};
        let h: String = Sha256::digest(KIMI_PAT_STR.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(h, "de5781783b193d5ccf5b1b28edfa70fa816ce78d54603fdc422cfd8d4ea4411f");
    }

    #[test]
    fn runs_are_cut_after_25000_code_points_and_py_isspace_has_the_separators() {
        assert!(py_isspace('\u{1c}') && py_isspace('\u{1f}') && py_isspace('\u{3000}') && !py_isspace('\u{200b}'));
        let text = format!("{}{}", "é".repeat(25_001), " ".repeat(3));
        let pieces = kimi_pieces(&text);
        assert_eq!(pieces, vec![(0, 50_000), (50_000, text.len())]);
        assert_eq!(kimi_pieces(""), vec![]);
        // separators count as whitespace: 25,001 of them make a run that is cut.
        let seps = "\u{1c}".repeat(25_001);
        assert_eq!(kimi_pieces(&seps).len(), 2);
    }
}

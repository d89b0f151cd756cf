#!/usr/bin/env python3
"""Python tiktoken's side of `aerie bench tokenizer` on a Kimi-format tokenizer directory.

  python scripts/bench_tokenizer.py --model-dir DIR --sharegpt ShareGPT_V3_unfiltered_cleaned_split.json \
      --max-conversations 2000 --texts-out texts.json
  aerie bench tokenizer --tokenizer DIR --texts texts.json --json

Writes the message texts of the first conversations of the ShareGPT file (truncated files are
fine: complete records are read one by one) as a JSON list, then measures on this thread, best
of --repeats: the load (`load_tiktoken_bpe` + `tiktoken.Encoding` with Kimi's pat_str and
specials, as tokenization_kimi.py's __init__ does), and the encode of every text both through
tokenization_kimi.py's `encode` (its 400k/25k pre-split loop in Python, then tiktoken) and
through tiktoken's `encode(allowed_special="all")` alone. ids_sha256 (of the Kimi path's ids,
little-endian u32) must equal aerie's.
"""

import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_tiktoken_fixtures import kimi_encode, load_encoding  # noqa: E402


def sharegpt_texts(path, max_conversations):
    raw = open(path, encoding="utf-8").read()
    dec = json.JSONDecoder()
    i = raw.index("[") + 1
    texts = []
    n = 0
    while n < max_conversations:
        while i < len(raw) and raw[i] in " \t\r\n,":
            i += 1
        try:
            rec, i = dec.raw_decode(raw, i)
        except json.JSONDecodeError:
            break  # the truncated tail
        n += 1
        texts.extend(t["value"] for t in rec.get("conversations", []) if isinstance(t.get("value"), str))
    return texts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--sharegpt", help="read texts from this ShareGPT JSON file")
    ap.add_argument("--texts", help="or from this JSON list of strings")
    ap.add_argument("--max-conversations", type=int, default=2000)
    ap.add_argument("--texts-out")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if a.sharegpt:
        texts = sharegpt_texts(a.sharegpt, a.max_conversations)
    else:
        texts = json.load(open(a.texts, encoding="utf-8"))
    if a.texts_out:
        with open(a.texts_out, "w", encoding="utf-8") as f:
            json.dump(texts, f, ensure_ascii=False)
    import tiktoken

    load = float("inf")
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        enc = load_encoding(a.model_dir)
        load = min(load, time.perf_counter() - t0)

    def timed(fn):
        best, ids_all = float("inf"), None
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            ids_all = [fn(t) for t in texts]
            best = min(best, time.perf_counter() - t0)
        return best, ids_all

    kimi_s, kimi_ids = timed(lambda t: kimi_encode(enc, t))
    raw_s, raw_ids = timed(lambda t: enc.encode(t, allowed_special="all"))
    h = hashlib.sha256()
    tokens = 0
    for ids in kimi_ids:
        tokens += len(ids)
        h.update(b"".join(i.to_bytes(4, "little") for i in ids))
    print(
        json.dumps(
            {
                "implementation": f"python tiktoken {tiktoken.__version__}",
                "load_seconds": load,
                "texts": len(texts),
                "chars": sum(len(t) for t in texts),
                "tokens": tokens,
                "kimi_encode_seconds": kimi_s,
                "kimi_tokens_per_second": tokens / kimi_s,
                "tiktoken_encode_seconds": raw_s,
                "tiktoken_tokens_per_second": sum(len(i) for i in raw_ids) / raw_s,
                "ids_sha256": h.hexdigest(),
            }
        )
    )


if __name__ == "__main__":
    main()

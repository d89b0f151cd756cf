#!/usr/bin/env python3
"""A synthetic target and chat data for checking aerie's CUDA path on a machine with no network.

Writes, under OUT:
  target/     a Llama target in the HF layout (config.json, model.safetensors, tokenizer.json,
              tokenizer_config.json) with SmolLM2-135M-Instruct's shape (H 576, 30 layers, 9/3
              heads of 64, I 1536, V 49152, tied head) and seeded random weights, and the byte-level
              tokenizer of aerie's test fixture (ids 0-255 are bytes, 256/257 the ChatML specials);
  sharegpt.jsonl  N ShareGPT conversations of generated text;
  prompts.jsonl   MT-Bench-style prompts.

Random weights make the teacher meaningless as a language model but exercise every kernel at the
real shape; the check compares the CPU and CUDA backends on the same inputs.
Needs numpy and safetensors only.
"""
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

H, LAYERS, HEADS, KV, HEAD_DIM, INTER, VOCAB = 576, 30, 9, 3, 64, 1536, 49152
IM_START, IM_END = 256, 257
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def target(out: Path, layers: int, seed: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": INTER, "num_hidden_layers": layers, "num_attention_heads": HEADS,
        "num_key_value_heads": KV, "head_dim": HEAD_DIM, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "max_position_embeddings": 8192, "tie_word_embeddings": True,
        "bos_token_id": IM_START, "eos_token_id": [IM_END], "torch_dtype": "float32",
        "rope_theta": 100000.0, "attention_bias": False, "use_cache": True,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(seed)

    def w(*shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    t = {"model.embed_tokens.weight": w(VOCAB, H, std=1.0), "model.norm.weight": np.ones(H, np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(H, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
        t[p + "self_attn.q_proj.weight"] = w(HEADS * HEAD_DIM, H, std=0.06)
        t[p + "self_attn.k_proj.weight"] = w(KV * HEAD_DIM, H, std=0.06)
        t[p + "self_attn.v_proj.weight"] = w(KV * HEAD_DIM, H, std=0.04)
        t[p + "self_attn.o_proj.weight"] = w(H, HEADS * HEAD_DIM, std=0.04 / np.sqrt(layers))
        t[p + "mlp.gate_proj.weight"] = w(INTER, H, std=0.04)
        t[p + "mlp.up_proj.weight"] = w(INTER, H, std=0.04)
        t[p + "mlp.down_proj.weight"] = w(H, INTER, std=0.03 / np.sqrt(layers))
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer(out)


def tokenizer(out: Path) -> None:
    """aerie's test-fixture tokenizer (crates/aerie-capture/tests/fixture/mod.rs), byte for byte."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    vocab, extra = {}, 0
    for b in range(256):
        if b in printable:
            c = chr(b)
        else:
            printable.append(b)
            extra += 1
            c = chr(255 + extra)
        vocab[c] = b

    def special(i, s):
        return {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}

    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(IM_START, "<|im_start|>"), special(IM_END, "<|im_end|>")],
        "normalizer": None, "pre_tokenizer": level, "post_processor": None,
        "decoder": dict(level, add_prefix_space=True),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }
    (out / "tokenizer.json").write_text(json.dumps(tok))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "chat_template": CHATML}))


WORDS = ("the drafter guesses tokens and the target verifies them in one pass so an accepted guess "
         "saves a decode step while a rejected one costs the verify time").split()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS, n)).capitalize() + "."


def data(out: Path, n: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    with open(out / "sharegpt.jsonl", "w") as f:
        for i in range(n):
            turns = []
            for _ in range(1 + i % 2):
                turns.append({"from": "human", "value": sentence(rng, 12)})
                turns.append({"from": "gpt", "value": " ".join(sentence(rng, 15) for _ in range(4))})
            f.write(json.dumps({"id": f"conv-{i}", "conversations": turns}) + "\n")
    with open(out / "prompts.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"question_id": i, "category": "writing",
                                "turns": [sentence(rng, 10)]}) + "\n")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else LAYERS
    conversations = int(sys.argv[3]) if len(sys.argv) > 3 else 48
    target(out / "target", layers)
    data(out, conversations)
    print(f"wrote {out}: target ({layers} layers), {conversations} conversations")

"""The transformers engine: any HF causal LM (`AutoModelForCausalLM`), on CPU or GPU, one
sample per forward (no padding, so every row is exact). It is the reference the SGLang engine is
compared with, and the way to capture targets aerie's native engine does not run.

Conventions, checked by the tests against forward hooks: transformers' `hidden_states[0]` is the
embedding output and `hidden_states[i+1]` the output of decoder layer i, so output-of-layer id i
is `hidden_states[i+1]`; `hidden_states[-1]` is the final norm's output (the head's input).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import CaptureOutput, Engine, TargetInfo
from ..teacher import topk_full


def target_info(config) -> TargetInfo:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    return TargetInfo(int(text.num_hidden_layers), int(text.hidden_size), int(text.vocab_size), arch)


class TransformersEngine(Engine):
    def __init__(
        self,
        target: str,
        aux_layers: list[int],
        final_hidden: bool,
        topk: Optional[int],
        device: str = "cpu",
        compute_dtype: torch.dtype = torch.float32,
        trust_remote_code: bool = False,
    ):
        import transformers
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=compute_dtype, trust_remote_code=trust_remote_code)
        self.model.to(self.device).eval()
        self.info = target_info(self.model.config)
        self.aux_layers = list(aux_layers)
        self.final_hidden = final_hidden
        self.topk = topk
        self._keep_ok = True
        self.description = f"transformers {transformers.__version__}, torch {torch.__version__}, {self.device.type}, {str(compute_dtype).removeprefix('torch.')}"

    @torch.inference_mode()
    def capture(self, batch: list[list[int]]) -> list[CaptureOutput]:
        outs = []
        for ids in batch:
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            # Without a top-k teacher only the hidden states are needed: skip the [T, V] head
            # where the model supports it (most transformers 5 causal LMs do).
            kwargs = {} if self.topk or not self._keep_ok else {"logits_to_keep": 1}
            try:
                out = self.model(input_ids=x, output_hidden_states=True, use_cache=False, **kwargs)
            except TypeError:
                if not kwargs:
                    raise
                self._keep_ok = False
                out = self.model(input_ids=x, output_hidden_states=True, use_cache=False)
            hs = out.hidden_states
            if len(hs) != self.info.num_layers + 1:
                raise RuntimeError(f"{self.info.architecture}: {len(hs)} hidden states for {self.info.num_layers} layers")
            aux = torch.cat([hs[i + 1][0] for i in self.aux_layers], dim=-1)
            final = hs[-1][0] if self.final_hidden else None
            tid = tlp = None
            if self.topk:
                tid, tlp = topk_full(out.logits[0], self.topk)
            outs.append(CaptureOutput(aux, final, tid, tlp))
        return outs

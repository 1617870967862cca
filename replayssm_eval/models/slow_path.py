"""The slow ground truth for a model-level run: token by token, every SSM layer through `decode_reference`.

The prompt goes in one call (Hugging Face's FP32 scan, as in every run); then each later token
goes alone through the model's one-token cache path (HF's conv update, KV cache, attention), and
each SSM layer through the step reference of its kernel family. A fast run over the same tokens
(the chunked kernels, any segmentation) must give the same logits: the adapter tests and the KL
driver's tests compare against this.
"""

from __future__ import annotations

import torch

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.models.adapter import ReplayModel


@torch.no_grad()
def token_by_token_logits(
    rm: ReplayModel, input_ids: torch.Tensor, *, prompt_len: int, config: ReplayConfig | str, seq_ids=None,
    attention_mask: torch.Tensor | None = None, compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Logits [B, T, vocab] of input_ids [B, T]: the prompt (with its padding mask, if any) then one token per call."""
    if not 0 < prompt_len <= input_ids.shape[1]:
        raise ValueError(f"prompt_len must be in [1, {input_ids.shape[1]}], got {prompt_len}")
    session = rm.new_session(config, seq_ids=seq_ids, engine="reference", compute_dtype=compute_dtype)
    logits = [rm.forward(input_ids[:, :prompt_len], session, attention_mask=attention_mask)]
    for t in range(prompt_len, input_ids.shape[1]):
        logits.append(rm.forward(input_ids[:, t : t + 1], session))
    return torch.cat(logits, dim=1)

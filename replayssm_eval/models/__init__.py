"""Hugging Face hybrid models with their SSM layers routed through the ReplaySSM kernels.

    from replayssm_eval.models import load_model
    rm = load_model("tiny-nemotron-h", dtype="fp32", device="cpu", config="nvfp4/fp16sr")
    session = rm.new_session(seq_ids=[0])          # one run: HF cache + per-layer ReplayState
    logits = rm.forward(prompt_ids, session)        # the prompt: exact FP32 anchor state
    logits = rm.forward(segment_ids, session)       # later tokens: chunked kernels, state carried

`adapter` (ReplayModel, load_model), `session` (ReplaySession), `model_types` (the supported model
types: their hook points, kernel family and geometry fields), `routing` + `hooks/` (the
hook points, one module per kernel family), `presets` (model geometry), `slow_path` (the
token-by-token ground truth), `traffic` (SSM state bytes per decode token).
"""

from replayssm_eval.models.adapter import ReplayModel, load_model
from replayssm_eval.models.model_types import MODEL_TYPES
from replayssm_eval.models.session import ReplaySession
from replayssm_eval.models.slow_path import token_by_token_logits
from replayssm_eval.models.traffic import state_traffic

__all__ = [
    "MODEL_TYPES", "ReplayModel", "ReplaySession", "load_model", "state_traffic", "token_by_token_logits",
]

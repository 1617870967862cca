"""What ReplaySSM stores and when, shared by every kernel family and by the code above the kernels.

`config` (ReplayConfig and its string form), `engine_presets` (serving-engine configs such as
`vllm:fp16sr`), `schedule` (where checkpoints are written), `keys` and `device_keys` (the Philox keys
of stochastic rounding), `state` (ReplayState and checkpoint writing), `skip` (the decay-skip
criterion), `buffer_round` (the buffer dtype inside Triton kernels).
"""

from replayssm_eval.replay.config import ReplayConfig, SpeculativeFlush
from replayssm_eval.replay.state import ReplayState

__all__ = ["ReplayConfig", "ReplayState", "SpeculativeFlush"]

"""ReplaySSM split-precision kernels.

`config` (ReplayConfig), `schedule` (where checkpoints are written), `keys` (SR random bits) and
`state` (ReplayState) are shared by the families in `mamba2/` and `gdn/`, each with a step-by-step
`decode_reference`, a teacher-forced `chunked` form and Triton kernels. `family` describes each
family (`KernelFamily`) for the code outside `kernels/`: `get_family(name)`.
"""

from replayssm_eval.kernels.config import ReplayConfig, SpeculativeFlush
from replayssm_eval.kernels.state import ReplayState

__all__ = ["ReplayConfig", "ReplayState", "SpeculativeFlush"]

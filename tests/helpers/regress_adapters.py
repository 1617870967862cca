"""Sample adapters for `replayssm-eval regress --kernel tests/helpers/regress_adapters.py:<name>` (docs/regress.md).

`triton_step` is how an engine's decode kernel is wrapped: it unpacks the token's inputs, hands the
ReplayState to the kernel and returns the output and the new state. Here the kernel is this
package's own Triton decode step, so it conforms. The other adapters are deliberately broken.
"""

from unittest import mock

import torch

from replayssm_eval.formats import PackedState
from replayssm_eval.formats.formats import ElementwiseFormat
from replayssm_eval.kernels.gdn import decode_step_triton as gdn_step
from replayssm_eval.kernels.kda import decode_step_triton as kda_step
from replayssm_eval.kernels.mamba2.triton_step import decode_step_triton as mamba2_step


def triton_step(family, inputs, state, config):
    """One decode token through the Triton step kernel of `family`."""
    if family == "mamba2":
        x, dt, A, B, C, D = (inputs[k] for k in ("x", "dt", "A", "B", "C", "D"))  # [B, H, P], [B, H], [H], [B, G, N]...
        return mamba2_step(x, dt, A, B, C, D, state, config, layer_idx=state.layer)
    q, k, v, g, beta = (inputs[name][:, None] for name in ("q", "k", "v", "g", "beta"))  # T = 1
    step = kda_step if family == "kda" else gdn_step
    o, new_state = step(q, k, v, g, beta, state, config, layer_idx=state.layer)
    return o[:, 0], new_state  # [B, HV, V]


def drops_d_term(family, inputs, state, config):
    """A Mamba-2 kernel that forgets the skip connection D x."""
    y, new_state = triton_step(family, inputs, state, config)
    if family == "mamba2":
        y = y - inputs["D"][:, None] * inputs["x"]
    return y, new_state


def truncate_fp16(x: torch.Tensor) -> torch.Tensor:
    """FP32 -> FP16 rounding toward zero (normal range): the 13 mantissa bits FP16 lacks are dropped."""
    bits = x.float().contiguous().view(torch.int32) & ~0x1FFF
    return torch.where(x.abs() < 2.0 ** -14, x.float(), bits.view(torch.float32)).to(torch.float16)


def truncating_fp16_encode(original):
    """`ElementwiseFormat.encode` (given as `original`) with FP16 rounded toward zero; other formats as before."""

    def encode(self, x, **kw):
        if self.base != "fp16":
            return original(self, x, **kw)
        return PackedState(self.name, tuple(x.shape), truncate_fp16(x))

    return encode


def truncating_recurrence(family, inputs, state, config):
    """A kernel whose FP16 stores round toward zero instead of to nearest even."""
    with mock.patch.object(ElementwiseFormat, "encode", truncating_fp16_encode(ElementwiseFormat.encode)):
        return triton_step(family, inputs, state, config)


def mamba2_only(family, inputs, state, config):
    """An engine that has no delta-rule (GDN, KDA) kernel."""
    if family != "mamba2":
        raise NotImplementedError("no Gated DeltaNet kernel in this engine")
    return triton_step(family, inputs, state, config)

"""ReplaySSM split-precision decoding of a Mamba-2 layer: step reference, chunked teacher-forced form, Triton.

    from replayssm_eval.kernels.mamba2 import chunked, decode_reference
    y, state = decode_reference(x, dt, A, B, C, D, initial_state, "nvfp4/fp16sr@16")
    y2, state2 = chunked(x2, dt2, A, B2, C2, D, state, "nvfp4/fp16sr@16")  # continues the same sequences

Shapes (Hugging Face): x [B, T, H, P], dt [B, T, H] (after softplus and bias), A [H] (negative),
B and C [B, T, G, N], D [H], state [B, H, P, N].
"""

from replayssm_eval.kernels.mamba2.chunked import chunked
from replayssm_eval.kernels.mamba2.reference import decode_reference, speculative_decode_reference

__all__ = ["chunked", "decode_reference", "speculative_decode_reference"]

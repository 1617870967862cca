"""SSM state formats: exact reference quantizers, their packed layouts, Philox, stochastic rounding, kernel codecs.

    from replayssm_eval.formats import get_format
    fmt = get_format("nvfp4:axis=dstate,scale=tensor")
    y = fmt.quantize(state)                     # fake quantization, same shape and dtype
    packed = fmt.encode(state); fmt.decode(packed)  # the bytes a kernel reads, and back (FP32)
    get_format("fp16sr").quantize(state, seed=1234, offset=0)

Formats: fp32, bf16, fp16, fp16sr, int16, int16sr, fp8, fp8sr, fp8e5m2, int8, int8sr, nvfp4, mxfp8,
mxfp4 (`list_formats()`). Spec grammar `name[:key=value,...]` (`registry`): e.g. `int8:scale=block:64`,
`fp8:scale=tile:32x0,max=240`, `int8:rot=hadamard:32`, `int8:ef=fp32`, `fp16sr:rounds=7,bits=8`, `nvfp4:scale=rowcol`,
and the engines' own layouts `fp16sr:words=pair` (vLLM), `fp16sr:words=quad,cvt=soft`, `int16:order=mul` (FlashInfer).

Layout convention. A state tensor is `[..., H, P, N]` = `[..., heads, head_dim, d_state]`. Every
index of the leading dims is one independent state (one sequence of one layer): no scale couples
two leading indices. Inputs with fewer than 3 dims get leading size-1 dims. Scale groups:
`tensor` = one scale per leading index (over H, P, N); `head` = per [P, N]; `row` = per row along
the block axis; `block:N` = per N consecutive elements along the axis; `tile:RxC` = per R rows x C
columns of the oriented head (0: the whole axis); `rowcol` = a column factor
per element of the axis times a row scale (`formats.ScaledFormat`). Block axes: `dstate` = consecutive elements along N (last dim), `headdim` = along
P (dim -2). A blocked dim that is not a multiple of the block is zero-padded (as
TransformerEngine does); padding shows in the packed data, never in the decoded shape.

Stochastic formats (fp16sr, fp8sr, int8sr, int16sr) need `seed=` (int) or `random_bits=`. The
Philox4x32-R counter of the element at flat row-major index i of x is `offset + i` (64-bit), key
`seed`, as `tl.randint(seed, offset + i, R)` (R = `rounds=`, 10 by default). `random_bits` (int64
tensor of uint32 values, x's shape) replaces Philox; a format uses bits [K-1:0] of each word
(K = `bits=`: 13 for fp16sr, 16 for fp8sr, int8sr and int16sr, 8 for mx8sr by default); `words=` picks
another assignment of words to elements: one Philox4x32 call per 2 or 4 elements of a row (`duo`, `quad`, every
stochastic format), and fp16sr's engine pairs (`pair`, `octet`; `formats.ElementwiseFormat`).

Kernels. `fmt.kernel_codec` (`codec.KernelCodec`, None where torch rounds the format) is all a Triton kernel reads of a
format: element kind, scale group (`rowcol` included: column factors, then row scales; `dualaxis`' row and column
factors), scale max, block, axis,
rotation, random-word layout, SR rounds and bits, and what the kernels can do with it. `device` holds the Triton
device codecs (roundings, encoders, decoders) every kernel calls;
`triton` the one-launch encoders `encode_triton` and `quantize_triton`.
"""

from replayssm_eval.formats.codec import KernelCodec
from replayssm_eval.formats.formats import StateFormat
from replayssm_eval.formats.packed import PackedState
from replayssm_eval.formats.registry import get_format, list_formats

__all__ = ["KernelCodec", "PackedState", "StateFormat", "get_format", "list_formats"]

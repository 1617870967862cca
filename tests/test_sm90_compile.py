"""The Triton kernels compile for an H100/H200 (sm_90) without a GPU.

The Triton interpreter, which runs the kernel tests on CPU, accepts code the GPU compiler refuses
(a non-constexpr global read inside @triton.jit code broke a GPU run once). Each kernel is compiled
here ahead of time for sm_90 with representative constexpr choices: pointer arguments are FP32
unless named in ARG_TYPES, scalars int32 unless named there. The test suite runs the interpreter
(tests/conftest.py), whose @triton.jit functions cannot be compiled, so the test runs this file as
a script in a subprocess without it, in PARTS parts (every PARTS-th case) that pytest-xdist's workers share.
"""

import inspect
import os
import subprocess
import sys

import pytest

GDN_FLAGS = {"pre_ptr": "*i32", "fold_ptr": "*i32", "rhi_ptr": "*i32"}  # GDN chunked: int32 flags (Mamba-2's pre is FP32)
ARG_TYPES = {  # every other pointer is *fp32, every other scalar i32
    "fold_ptr": "*i8", "read_hi_ptr": "*i8", "rhi_ptr": "*i8", "take_ptr": "*i8", "count_ptr": "*i64", "ck_ptr": "*i64",
    "key_ptr": "*i64", "ckpt_ptr": "*i64", "key_hi_ptr": "*i64", "key_lo_ptr": "*i64", "last_ptr": "*i32",
    "exch_ptr": "*i32", "ticket_ptr": "*i32", "before_ptr": "*i32",
    "data_ptr": "*u8", "scale_ptr": "*u8", "scales_ptr": "*u8", "skip": "fp32", "eps": "fp32",
}


def cases() -> list:
    """(kernel, constexprs[, argument types]): representative launches of each kernel (imported here: real @triton.jit only)."""
    from replayssm_eval.formats import triton as formats
    from replayssm_eval.formats import triton_dual_axis as formats_dual
    from replayssm_eval.formats.codec import Group, Kind, Order, Residual, Words
    from replayssm_eval.kernels.gdn import triton_chunk as gdn_chunk_module
    from replayssm_eval.kernels.gdn import triton_step as gdn_step_module
    from replayssm_eval.kernels.kda import triton_chunk as kda_chunk_module
    from replayssm_eval.kernels.kda import triton_step as kda_step_module
    from replayssm_eval.kernels.mamba2 import triton_chunk as mamba2_chunk_module
    from replayssm_eval.kernels.mamba2 import triton_phases as mamba2_phases
    from replayssm_eval.kernels.mamba2 import triton_step as mamba2_step_module
    from replayssm_eval.kernels.mamba2 import triton_tokens as mamba2_tokens
    from replayssm_eval.models import decode_attention

    nvfp4, fp16sr, fp8, fp32 = int(Kind.NVFP4), int(Kind.FP16SR), int(Kind.FP8), int(Kind.FP32)
    none, row, head, tensor, tile = (int(g) for g in (Group.NONE, Group.ROW, Group.HEAD, Group.TENSOR, Group.TILE))
    div, mul = int(Order.DIV), int(Order.MUL)
    element, pair, quad, octet = int(Words.ELEMENT), int(Words.PAIR), int(Words.QUAD), int(Words.OCTET)
    # `KernelCodec.random` (words, Philox rounds, bits): a deterministic kind's; non-default rounds= and bits=
    plain, paired, sr8, sr32 = (element, 10, 0), (pair, 10, 13), (element, 7, 8), (element, 10, 32)
    gdn_chunk = dict(SEGS=8, LP=16, BK=128, BV=32, CLOSED=False, SHARED=False, HI_KIND=fp16sr, HI_GROUP=none, HI_MAX=1.0,
                     HI_ORDER=div, HI_RANDOM=paired, HI_ROWS=1, HI_COLS=0, HI_AXIS=0, HI_ROT=1, HI_EF=0,
                     LO_KIND=nvfp4, LO_GROUP=row, LO_MAX=1.0, LO_ORDER=div, LO_RANDOM=plain, LO_ROWS=1, LO_COLS=0,
                     LO_AXIS=0, LO_ROT=1, LO_EF=0, PROGRAMS=1, TICKETS=False, DOT="ieee", BUF=0)
    exchange = {"fold_ptr": "*i32", "rhi_ptr": "*i32", "count_ptr": "*i32"}  # `shared_head_amax`
    mamba2_chunk = dict(RECUR=fp16sr, RECUR_GROUP=none, RECUR_MAX=1.0, RECUR_ORDER=div, RECUR_RANDOM=(octet, 10, 8),
                        RECUR_ROWS=1, RECUR_COLS=0, RECUR_AXIS=0, RECUR_ROT=1, READ=nvfp4, READ_GROUP=row, READ_MAX=1.0,
                        READ_ORDER=div, READ_RANDOM=plain, READ_ROWS=1, READ_COLS=0, READ_AXIS=0, READ_ROT=1,
                        RECUR_EF=0, READ_EF=0, SHARED=False, LO_OUTSIDE=False, SKIP=True, DOT="ieee", READ_DOT="tf32x3",
                        PROGRAMS=1, BUF=0,
                        BLOCK_L=16, BLOCK_P=16, BLOCK_N=128, CHUNK_N=32)
    fold_chain = {k: v for k, v in mamba2_chunk.items() if k.startswith("RECUR") or k in ("SKIP", "DOT", "BLOCK_L",
                                                                                          "BLOCK_P")}
    fold_chain.update(READ_ORDER=div, BUF=0, BLOCK_N=32)
    round_slots = dict(READ=nvfp4, READ_GROUP=head, READ_MAX=1.0, READ_ORDER=div, READ_RANDOM=plain, BLOCK_P=16,
                       BLOCK_N=128)
    segment_outputs = {k: v for k, v in mamba2_chunk.items() if k in (
        "SKIP", "DOT", "READ_DOT", "BLOCK_L", "BLOCK_P", "BLOCK_N", "CHUNK_N")}
    token_scan = {k: v for k, v in mamba2_chunk.items() if k.startswith(("RECUR", "READ")) and k != "READ_DOT"}
    token_scan.update(SHARED=False, SKIP=True, BUF=1, DOT="ieee", PROGRAMS=1, BLOCK_P=16, BLOCK_N=128)
    # scale tiles and MX blocks rounded in the loop: blocks of 32 along d_state, SGLang's 32-row tiles, MXFP4
    pimba = dict(GROUP=tile, MAX=127.0, ROWS=1, COLS=32)  # int8sr:scale=block:32
    sglang = dict(GROUP=tile, MAX=240.0, ROWS=32, COLS=0)  # fp8:scale=tile:32x0,max=240
    int8sr, mxfp4, mxfp8 = int(Kind.INT8SR), int(Kind.MXFP4), int(Kind.MXFP8)
    mx8, mx8sr = int(Kind.MX8), int(Kind.MX8SR)
    # modelopt:int8-hadamard: INT8 blocks of 32 along head_dim, rotated by H_32 along head_dim (FP64 butterflies)
    modelopt = dict(KIND=int(Kind.INT8), GROUP=tile, MAX=127.0, ROWS=1, COLS=32, AXIS=1, ROT=32)
    # stepquant:dualaxis6 (codes within +-31, factors over the whole head of 128 columns in FP64)
    dual = dict(GROUP=int(Group.DUAL), MAX=31.0, ROWS=1, COLS=128, AXIS=1)
    encode = dict(AXIS=0, ROT=1, BLOCK_R=16, BLOCK_C=128, TAKE=False, BLOCK_B=256, DECODED=False)
    dual_encode = {"r_ptr": "*i16", "c_ptr": "*i16", "codes_ptr": "*u8"}
    mamba2_step = dict(P=80, N=128, NB=128, READ=nvfp4, GROUP=tensor, SKIP=False, FOLD=True, SPLIT=False, BLOCK_E=16,
                       BLOCK_P=16, BLOCK_N=128, BLOCK_S=8, TILES=5, HI_AT_FOLD=False, BUF=0)
    # decode attention: Qwen3.5-4B's geometry in bf16 (64-column blocks, one split), Nemotron-3-Nano-4B's (32, two
    # splits), an FP32 model's (FP32 FMAs)
    attention = dict(SPLITS=1, BLOCK_G=16, BLOCK_N=64, BLOCK_D=256, PRECISION="tf32", UPCAST=False)
    bf16_kv = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "mask_ptr": "*i1", "span_ptr": "*i32",
               "scaling": "fp32"}
    return [
        (decode_attention._split_kernel, attention, bf16_kv),
        (decode_attention._split_kernel, {**attention, "SPLITS": 2, "BLOCK_N": 32, "BLOCK_D": 128}, bf16_kv),
        (decode_attention._split_kernel, {**attention, "BLOCK_D": 64, "PRECISION": "ieee"},
         {**bf16_kv, "q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32"}),
        (decode_attention._combine_kernel, dict(SPLITS=2, BLOCK_G=16, BLOCK_D=128), {"o_ptr": "*bf16"}),
        (formats._encode_kernel, dict(KIND=nvfp4, GROUP=row, MAX=1.0, ORDER=div, RANDOM=plain, **encode)),
        # a flush of some states (take=): programs loop over the taken ones
        (formats._encode_kernel, dict(KIND=nvfp4, GROUP=head, MAX=1.0, ORDER=div, RANDOM=plain, **{**encode, "TAKE": True})),
        (formats._encode_kernel, dict(KIND=int(Kind.FP8SR), GROUP=head, MAX=448.0, ORDER=div, RANDOM=sr8, **encode)),
        (formats._encode_kernel, dict(KIND=int(Kind.INT16), GROUP=row, MAX=32767.0, ORDER=mul, RANDOM=plain, **encode),
         {"data_ptr": "*i16"}),
        (formats._encode_kernel, dict(KIND=int(Kind.INT8SR), GROUP=head, MAX=127.0, ORDER=div, RANDOM=sr32,
                                      **{**encode, "TAKE": True, "DECODED": True}),
         {"data_ptr": "*i8"}),
        (formats._encode_kernel, dict(KIND=int(Kind.FP16SR_SOFT), GROUP=none, MAX=1.0, ORDER=div, RANDOM=paired, **encode),
         {"data_ptr": "*fp16"}),
        # scale tiles: SGLang's FP8 pool of some states, Pimba's INT8+SR blocks of 32
        (formats._encode_kernel, dict(KIND=fp8, GROUP=tile, MAX=240.0, ORDER=div, RANDOM=plain,
                                      **{**encode, "TAKE": True, "DECODED": True})),
        (formats._encode_kernel, dict(KIND=int8sr, GROUP=tile, MAX=127.0, ORDER=div, RANDOM=(quad, 10, 16), **encode),
         {"data_ptr": "*i8"}),
        # INT16+SR codes along head_dim, one Philox call per 4 elements (drawn element by element: unaligned groups)
        (formats._encode_kernel, dict(KIND=int(Kind.INT16SR), GROUP=row, MAX=32767.0, ORDER=div,
                                      RANDOM=(quad, 10, 16), **{**encode, "AXIS": 1}), {"data_ptr": "*i16"}),
        # Pimba's MX8 + SR bytes and MXFP4 nibbles, some states taken, the decoded copy written
        (formats._encode_kernel, dict(KIND=mx8sr, GROUP=none, MAX=1.0, ORDER=div, RANDOM=sr32,
                                      **{**encode, "TAKE": True, "DECODED": True}), {"data_ptr": "*u8"}),
        (formats._encode_kernel, dict(KIND=mxfp4, GROUP=none, MAX=1.0, ORDER=div, RANDOM=plain,
                                      **{**encode, "TAKE": True, "DECODED": True}),
         {"data_ptr": "*u8", "scales_ptr": "*u8"}),
        # stepquant:dualaxis6 on Mamba-2's [80, 128] heads (rows along d_state) and width 3 on GDN's, some states taken
        (formats_dual._dual_axis_encode_kernel, dict(P=80, N=128, QMAX=31.0, WIDTH=6, AXIS=1, TAKE=True, DECODED=True,
                                                     BLOCK_P=128, BLOCK_N=128, BYTES=512), dual_encode),
        (formats_dual._dual_axis_encode_kernel, dict(P=128, N=128, QMAX=3.0, WIDTH=3, AXIS=0, TAKE=False,
                                                     DECODED=False, BLOCK_P=128, BLOCK_N=128, BYTES=512), dual_encode),
        # modelopt:int8-hadamard's flush (codes along head_dim, rotated) and NVFP4 along head_dim with column factors
        (formats._encode_kernel, dict(KIND=int(Kind.INT8), GROUP=tile, MAX=127.0, ORDER=div, RANDOM=plain,
                                      **{**encode, "AXIS": 1, "ROT": 32, "TAKE": True, "DECODED": True}),
         {"data_ptr": "*i8"}),
        (formats._encode_kernel, dict(KIND=nvfp4, GROUP=int(Group.ROWCOL), MAX=1.0, ORDER=div, RANDOM=plain,
                                      **{**encode, "AXIS": 1, "DECODED": True})),
        (formats._quantize_kernel, dict(KIND=fp16sr, GROUP=none, MAX=1.0, ORDER=div, RANDOM=(octet, 7, 8), SOURCE=2,
                                        BLOCK_R=16, BLOCK_C=128), {"seed": "i64", "offset": "i64", "bits_ptr": "*i64"}),
        (formats._quantize_kernel, dict(KIND=mx8sr, GROUP=none, MAX=1.0, ORDER=div, RANDOM=sr32, SOURCE=2,
                                        BLOCK_R=16, BLOCK_C=128), {"seed": "i64", "offset": "i64", "bits_ptr": "*i64"}),
        (formats._head_amax_kernel, dict(GROUP_ELEMS=80 * 128, TAKE=True, ORDER=mul, BLOCK=2048), {"take_ptr": "*i8"}),
        (gdn_chunk_module._chunked_kernel, gdn_chunk, GDN_FLAGS),
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "BUF": 1}, GDN_FLAGS),  # u's rounded to a bf16 buffer
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "CLOSED": True, "BV": 128, "LO_GROUP": head, "DOT": "tf32x3"}, GDN_FLAGS),
        # one segment per launch, S_hi kept in FP32 for the torch rounding
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "SEGS": 1, "SHARED": True, "HI_KIND": fp32, "DOT": "tf32x3"}, GDN_FLAGS),
        (kda_chunk_module._chunked_kernel, {**gdn_chunk, "CLOSED": True, "BUF": 1},
         {"fold_ptr": "*i32", "rhi_ptr": "*i32"}),
        # window 1 (conventional decoding): one-row windows, products as broadcast sums
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "LP": 1, "SHARED": True, "HI_KIND": int(Kind.INT8),
                                            "HI_GROUP": row, "HI_MAX": 127.0, "BUF": 1}, GDN_FLAGS),
        (kda_chunk_module._chunked_kernel, {**gdn_chunk, "LP": 1, "BV": 128, "LO_GROUP": head},
         {"fold_ptr": "*i32", "rhi_ptr": "*i32"}),
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "HI_KIND": int(Kind.INT16SR), "HI_GROUP": row, "HI_MAX": 32767.0,
                                            "LO_KIND": int(Kind.INT8), "LO_MAX": 127.0, "LO_ORDER": mul}, GDN_FLAGS),
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "HI_KIND": int8sr, **{f"HI_{k}": v for k, v in pimba.items()},
                                            "LO_KIND": fp8, **{f"LO_{k}": v for k, v in sglang.items()}}, GDN_FLAGS),
        (kda_chunk_module._chunked_kernel, {**gdn_chunk, "CLOSED": True, "BV": 128, "HI_KIND": mxfp4, "LO_KIND": fp8,
                                            **{f"LO_{k}": v for k, v in sglang.items()}},
         {"fold_ptr": "*i32", "rhi_ptr": "*i32"}),
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "SHARED": True, **{f"HI_{k}": v for k, v in modelopt.items()}},
         GDN_FLAGS),
        # head scales across the four 32-column programs of a head: the read copy's, both copies'
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "LO_GROUP": head, "PROGRAMS": 4, "DOT": "tf32x3"},
         {**GDN_FLAGS, **exchange}),
        (kda_chunk_module._chunked_kernel, {**gdn_chunk, "HI_KIND": int(Kind.INT8), "HI_GROUP": head, "HI_MAX": 127.0,
                                            "LO_GROUP": head, "PROGRAMS": 4}, exchange),
        # rotated along d_state (K) and along head_dim (V, the whole head) with MX blocks along V
        (kda_chunk_module._chunked_kernel, {**gdn_chunk, "BV": 128, "HI_ROT": 16, "LO_KIND": mxfp8, "LO_GROUP": none,
                                            "LO_AXIS": 1, "LO_ROT": 64}, {"fold_ptr": "*i32", "rhi_ptr": "*i32"}),
        # Pimba's MX8: mx8sr along K / mx8 along V in blocks of 16 (programs of 32 v columns)
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "HI_KIND": mx8sr, "HI_RANDOM": sr32, "LO_KIND": mx8,
                                            "LO_GROUP": none, "LO_AXIS": 1}, GDN_FLAGS),
        # error feedback: an FP32 residual beside the fp16sr copy, a BF16 one beside NVFP4; a shared INT8 checkpoint's
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "HI_EF": int(Residual.FP32), "LO_EF": int(Residual.BF16)},
         GDN_FLAGS),
        (kda_chunk_module._chunked_kernel, {**gdn_chunk, "LP": 1, "SHARED": True, "HI_KIND": int(Kind.INT8),
                                            "HI_GROUP": row, "HI_MAX": 127.0, "HI_EF": int(Residual.BF16)},
         {"fold_ptr": "*i32", "rhi_ptr": "*i32"}),
        # stepquant:dualaxis6 at window 1: a shared checkpoint in whole-head programs
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "LP": 1, "BV": 128, "SHARED": True, "HI_KIND": int(Kind.INT8),
                                            **{f"HI_{k}": v for k, v in dual.items()}}, GDN_FLAGS),
        (kda_chunk_module._chunked_kernel, {**gdn_chunk, "LP": 1, "BV": 128, "SHARED": True, "HI_KIND": int(Kind.INT8),
                                            **{f"HI_{k}": v for k, v in dual.items()}},
         {"fold_ptr": "*i32", "rhi_ptr": "*i32"}),
        # and over the head's programs exchanging the row sums at batch 1: GDN's eight of 16 columns (more than
        # the GPU's SMs: numbered by tickets), KDA's four of 32
        (gdn_chunk_module._chunked_kernel, {**gdn_chunk, "LP": 1, "BV": 16, "SHARED": True, "HI_KIND": int(Kind.INT8),
                                            **{f"HI_{k}": v for k, v in dual.items()}, "PROGRAMS": 8,
                                            "TICKETS": True},
         {**GDN_FLAGS, "exch_ptr": "*i64", "count_ptr": "*i32"}),
        (kda_chunk_module._chunked_kernel, {**gdn_chunk, "LP": 1, "SHARED": True, "HI_KIND": int(Kind.INT8),
                                            **{f"HI_{k}": v for k, v in dual.items()}, "PROGRAMS": 4},
         {"fold_ptr": "*i32", "rhi_ptr": "*i32", "exch_ptr": "*i64", "count_ptr": "*i32"}),
        (gdn_step_module._replay_step_kernel, dict(K=128, V=128, KP=128, BK=128, KIND=nvfp4, GROUP=tensor, SKIP=True,
                                       FOLD=True, SPLIT=True, CLOSED=False, SHARED=True, BLOCK_E=16, BLOCK_V=32,
                                       BLOCK_K=64, TILES=4, COLUMNS=False, HI_AT_FOLD=False, BUF=1)),
        # an FP32 read's open fold by columns (`fold_columns`)
        (gdn_step_module._replay_step_kernel, dict(K=128, V=128, KP=128, BK=128, KIND=fp32, GROUP=none, SKIP=False,
                                       FOLD=True, SPLIT=False, CLOSED=False, SHARED=True, BLOCK_E=16, BLOCK_V=32,
                                       BLOCK_K=32, TILES=1, COLUMNS=True, HI_AT_FOLD=True, BUF=0)),
        # a short window's open fold: the buffer sum as a broadcast
        (gdn_step_module._replay_step_kernel, dict(K=100, V=100, KP=112, BK=128, KIND=fp8, GROUP=row, SKIP=False,
                                       FOLD=True, SPLIT=False, CLOSED=False, SHARED=False, BLOCK_E=4, BLOCK_V=16,
                                       BLOCK_K=32, TILES=1, COLUMNS=False, HI_AT_FOLD=False, BUF=0)),
        # a reading launch below 4096 rows x heads: NVFP4 as bytes (a folding one: as whole words), one tile (four
        # unrolled tiles, a launch only the sweeps use, take 73 s: Triton's coalescing pass over their loads)
        (gdn_step_module._replay_step_kernel, dict(K=128, V=128, KP=128, BK=128, KIND=nvfp4, GROUP=row, SKIP=False,
                                       FOLD=False, SPLIT=False, CLOSED=False, SHARED=False, BLOCK_E=16, BLOCK_V=16,
                                       BLOCK_K=128, TILES=1, COLUMNS=False, HI_AT_FOLD=False, BUF=0)),
        # a reading launch: NVFP4 words summed by the threads holding their rows, K not a multiple of 16
        (gdn_step_module._replay_step_kernel, dict(K=100, V=128, KP=112, BK=128, KIND=nvfp4, GROUP=head, SKIP=True,
                                       FOLD=False, SPLIT=True, CLOSED=False, SHARED=False, BLOCK_E=16, BLOCK_V=32,
                                       BLOCK_K=64, TILES=4, COLUMNS=False, WORDS=2, HI_AT_FOLD=True, BUF=0)),
        (kda_step_module._head_terms_kernel, dict(K=128, BK=128, BLOCK_E=16, SKIP=True, KEYS=True, FOLDING=False,
                                                  PDL=True)),
        (kda_step_module._head_terms_kernel, dict(K=100, BK=128, BLOCK_E=16, SKIP=False, KEYS=False, FOLDING=True,
                                                  PDL=False)),
        (kda_step_module._replay_step_kernel, dict(K=128, V=128, KP=128, BK=128, KIND=nvfp4, GROUP=head, SKIP=True,
                                       SPLIT=True, WORDS=True, BLOCK_E=16, BLOCK_V=16, BLOCK_K=128, HI_AT_FOLD=True,
                                       TERMS=False, PDL=True)),
        (kda_step_module._replay_step_kernel, dict(K=128, V=128, KP=128, BK=128, KIND=nvfp4, GROUP=row, SKIP=False,
                                       SPLIT=False, WORDS=False, BLOCK_E=16, BLOCK_V=32, BLOCK_K=64, HI_AT_FOLD=False,
                                       TERMS=False, PDL=False)),
        (kda_step_module._replay_step_kernel, dict(K=100, V=100, KP=112, BK=128, KIND=fp8, GROUP=row, SKIP=False,
                                       SPLIT=False, WORDS=False, BLOCK_E=16, BLOCK_V=16, BLOCK_K=16, HI_AT_FOLD=True,
                                       TERMS=False, PDL=True)),
        (kda_step_module._replay_step_kernel, dict(K=128, V=128, KP=128, BK=128, KIND=nvfp4, GROUP=row, SKIP=False,
                                       SPLIT=False, WORDS=2, BLOCK_E=16, BLOCK_V=64, BLOCK_K=32, HI_AT_FOLD=True,
                                       TERMS=False, PDL=True)),
        # whole heads computing their terms: rows summed by their threads, or tiles of words at K not a power of two
        (kda_step_module._replay_step_kernel, dict(K=128, V=128, KP=128, BK=128, KIND=nvfp4, GROUP=head, SKIP=True,
                                       SPLIT=True, WORDS=2, BLOCK_E=16, BLOCK_V=128, BLOCK_K=32, HI_AT_FOLD=True,
                                       TERMS=True, PDL=True)),
        (kda_step_module._replay_step_kernel, dict(K=100, V=100, KP=112, BK=128, KIND=nvfp4, GROUP=row, SKIP=False,
                                       SPLIT=False, WORDS=1, BLOCK_E=16, BLOCK_V=128, BLOCK_K=64, HI_AT_FOLD=True,
                                       TERMS=True, PDL=True)),
        (kda_step_module._replay_fold_kernel, dict(K=128, V=128, KP=128, BK=128, KIND=nvfp4, GROUP=head, CLOSED=False,
                                       SHARED=True, BUF=1, SPLIT=True, BLOCK_E=16, BLOCK_V=16, BLOCK_K=32,
                                       STAGES=2, HI_AT_FOLD=True, PDL=True)),
        (kda_step_module._replay_fold_kernel, dict(K=128, V=128, KP=128, BK=128, KIND=nvfp4, GROUP=head, CLOSED=False,
                                       SHARED=False, BUF=0, SPLIT=False, BLOCK_E=16, BLOCK_V=64, BLOCK_K=64,
                                       STAGES=3, HI_AT_FOLD=True, PDL=True)),
        (kda_step_module._replay_fold_kernel, dict(K=100, V=100, KP=112, BK=128, KIND=fp8, GROUP=row, CLOSED=True,
                                       SHARED=False, BUF=0, SPLIT=False, BLOCK_E=16, BLOCK_V=16, BLOCK_K=32,
                                       STAGES=1, HI_AT_FOLD=False, PDL=False)),
        (gdn_step_module._step_kernel, dict(W=3, CP=16, BK=128, BV=64, KIND=nvfp4, GROUP=row, SKIP=False),
         {"width_ptr": "*i64", "rhi_ptr": "*i32"}),
        (mamba2_chunk_module._chunk_scan_kernel, mamba2_chunk),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "LO_OUTSIDE": True, "READ": fp16sr, "READ_GROUP": none,
                                                  "BUF": 1}),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "RECUR": fp32, "SHARED": True}),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "BLOCK_L": 1, "RECUR": int(Kind.INT16SR),
                                                  "RECUR_GROUP": row, "RECUR_MAX": 32767.0, "SHARED": True}),
        # the phases of a head-scaled read copy: the default (S_hi fp16sr in 32-column fold tiles, S_lo NVFP4 with
        # the head's amax), an INT16 S_hi with row scales (fold programs holding whole rows) beside an SR read copy,
        # one-token windows
        (mamba2_phases._fold_chain_kernel, fold_chain),
        (mamba2_phases._round_slots_kernel, round_slots),
        (mamba2_phases._fold_chain_kernel, {**fold_chain, "RECUR": int(Kind.INT16), "RECUR_GROUP": row,
                                            "RECUR_MAX": 32767.0, "RECUR_ORDER": mul, "BLOCK_N": 128}),
        (mamba2_phases._round_slots_kernel, {**round_slots, "READ": int(Kind.INT8SR), "READ_MAX": 127.0,
                                             "READ_RANDOM": sr8}),
        (mamba2_phases._segment_outputs_kernel, segment_outputs),
        (mamba2_phases._fold_chain_kernel, {**fold_chain, "BLOCK_L": 1, "BUF": 1}),
        (mamba2_phases._segment_outputs_kernel, {**segment_outputs, "BLOCK_L": 1}),
        # one-token windows with the state in registers: split copies (fp16sr, row-scaled NVFP4) from a bf16 ring;
        # vllm:int16sr (a shared INT16+SR checkpoint with row scales, one Philox call per 4 elements)
        (mamba2_tokens._token_scan_kernel, token_scan),
        (mamba2_tokens._token_scan_kernel, {**token_scan, "RECUR": int(Kind.INT16SR), "RECUR_GROUP": row,
                                            "RECUR_MAX": 32767.0, "RECUR_RANDOM": (quad, 10, 16), "SHARED": True,
                                            "SKIP": False, "BUF": 0}),
        # sglang:fp8 (a shared FP8 checkpoint, scale tiles of 32 head_dim rows): programs of 32 rows
        (mamba2_tokens._token_scan_kernel, {**token_scan, "RECUR": fp8, **{f"RECUR_{k}": v for k, v in sglang.items()},
                                            "RECUR_RANDOM": plain, "SHARED": True, "SKIP": False, "BUF": 0,
                                            "BLOCK_P": 32}),
        # and its last rows past the 32-row slabs in 16-row programs, the tiles cut to them (`tail_codecs`)
        (mamba2_tokens._token_scan_kernel, {**token_scan, "RECUR": fp8, **{f"RECUR_{k}": v for k, v in sglang.items()},
                                            "RECUR_ROWS": 16, "RECUR_RANDOM": plain, "SHARED": True, "SKIP": False,
                                            "BUF": 0, "BLOCK_P": 16}),
        # stepquant:dualaxis6 over the head's five 16-row programs exchanging the row sums
        (mamba2_tokens._token_scan_kernel, {**token_scan, "RECUR": int(Kind.INT8),
                                            **{f"RECUR_{k}": v for k, v in {**dual, "COLS": 80}.items()},
                                            "RECUR_RANDOM": plain, "SHARED": True, "SKIP": False, "BUF": 0,
                                            "PROGRAMS": 5}, {"exch_ptr": "*i64", "count_ptr": "*i32"}),
        # head scales over the head's five 16-row programs exchanging the amax: both copies', a shared checkpoint's
        # (window 1 too)
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "RECUR": nvfp4, "RECUR_GROUP": head,
                                                  "READ_GROUP": head, "PROGRAMS": 5}, {"count_ptr": "*i32"}),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "RECUR": nvfp4, "RECUR_GROUP": head, "SHARED": True,
                                                  "PROGRAMS": 5}, {"count_ptr": "*i32"}),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "BLOCK_L": 1, "RECUR": int(Kind.INT8),
                                                  "RECUR_GROUP": head, "RECUR_MAX": 127.0, "READ_GROUP": head,
                                                  "PROGRAMS": 5}, {"count_ptr": "*i32"}),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "RECUR": int(Kind.INT16), "RECUR_GROUP": row,
                                                  "RECUR_MAX": 32767.0, "RECUR_ORDER": mul, "READ": int(Kind.INT8SR),
                                                  "READ_MAX": 127.0, "READ_RANDOM": sr8}),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "BLOCK_P": 128, "RECUR": mxfp8, "READ": fp8,
                                                  **{f"READ_{k}": v for k, v in sglang.items()}}),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "RECUR": int8sr,
                                                  **{f"RECUR_{k}": v for k, v in pimba.items()}}),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "BLOCK_P": 64, "SHARED": True,
                                                  **{("RECUR" if k == "KIND" else f"RECUR_{k}"): v
                                                     for k, v in modelopt.items()}}),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "BLOCK_L": 1, "BLOCK_P": 128, "SHARED": True,
                                                  "RECUR": int(Kind.INT8),
                                                  **{f"RECUR_{k}": v for k, v in {**dual, "COLS": 80}.items()}}),
        # fp8sr:axis=headdim,rot=hadamard:16 (the whole head) / nvfp4:scale=row,rot=hadamard:8 (along d_state)
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "RECUR": int(Kind.FP8SR), "RECUR_GROUP": row,
                                                  "RECUR_MAX": 448.0, "RECUR_RANDOM": sr8, "RECUR_AXIS": 1,
                                                  "RECUR_ROT": 16, "READ_ROT": 8, "BLOCK_P": 64}),
        # mx8sr along d_state / mx8 along head_dim (blocks of 16 in programs of 16 rows)
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "RECUR": mx8sr, "RECUR_RANDOM": sr8, "READ": mx8,
                                                  "READ_GROUP": none, "READ_AXIS": 1}),
        # error feedback: FP32 and BF16 residuals of split copies, the recurrence copy's beside a read copy torch
        # rounds, a shared INT8 checkpoint's in the token scan's registers, the phases' fold chain's
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "RECUR_EF": int(Residual.FP32),
                                                  "READ_EF": int(Residual.BF16)}),
        (mamba2_chunk_module._chunk_scan_kernel, {**mamba2_chunk, "LO_OUTSIDE": True, "READ": fp32, "READ_GROUP": none,
                                                  "RECUR_EF": int(Residual.BF16)}),
        (mamba2_tokens._token_scan_kernel, {**token_scan, "RECUR": int(Kind.INT8), "RECUR_GROUP": row,
                                            "RECUR_MAX": 127.0, "RECUR_RANDOM": plain, "RECUR_EF": int(Residual.BF16),
                                            "SHARED": True, "BUF": 0}),
        (mamba2_phases._fold_chain_kernel, {**fold_chain, "RECUR_EF": int(Residual.FP32)}),
        (mamba2_step_module._replay_step_kernel, mamba2_step),
        (mamba2_step_module._replay_step_kernel, {**mamba2_step, "FOLD": False}),  # NVFP4 as words (folding: bytes)
        # a fixed window's launches: S_hi read where a row folds, no per-row flag
        (mamba2_step_module._replay_step_kernel, {**mamba2_step, "HI_AT_FOLD": True}),
        (mamba2_step_module._replay_step_kernel, {**mamba2_step, "FOLD": False, "HI_AT_FOLD": True}),
        # the two launches of a step where some rows fold
        (mamba2_step_module._replay_step_kernel, {**mamba2_step, "SPLIT": True, "BUF": 1}),
        (mamba2_step_module._replay_step_kernel, {**mamba2_step, "FOLD": False, "SPLIT": True}),
        (mamba2_step_module._replay_step_kernel, {**mamba2_step, "READ": fp8, "GROUP": row, "SKIP": True, "FOLD": False,
                                      "BLOCK_P": 8, "TILES": 10}),
        (mamba2_step_module._replay_step_kernel, {**mamba2_step, "READ": int(Kind.INT16), "GROUP": row, "FOLD": False,
                                      "BLOCK_P": 8, "TILES": 10}, {"data_ptr": "*i16"}),
    ]


def signature(kernel, constexprs: dict, types: dict) -> dict:
    """The argument types of a case (each constexpr it gives; every other argument as `types` or ARG_TYPES say). Every
    constexpr parameter without a default must be given: one typed as a scalar would compile both sides of its
    branches, which is not the launch."""
    params = inspect.signature(kernel.fn).parameters
    missing = [name for name, p in params.items()
               if "constexpr" in str(p.annotation) and p.default is inspect.Parameter.empty and name not in constexprs]
    assert not missing, f"{kernel.__name__}: constexprs {missing} not given"
    types = {**ARG_TYPES, **types}
    return {name: "constexpr" if name in constexprs else types.get(name, "*fp32" if name.endswith("_ptr") else "i32")
            for name in params}


PARTS = 6  # about 11 minutes of compiling on one core of a 2-core AMD EPYC without a Triton cache, all parts together


def compile_cases(chosen: list) -> list[str]:
    """Compile the chosen cases for sm_90; returns one line per failure."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failures = []
    for kernel, constexprs, *types in chosen:
        try:
            source = ASTSource(kernel, signature(kernel, constexprs, *types or [{}]), constexprs=constexprs)
            assert triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"]
        except Exception as err:  # noqa: BLE001  every failure is reported, not only the first
            failures.append(f"{kernel.__name__} {constexprs}: {type(err).__name__}: {err}")
    return failures


def test_every_case_gives_its_kernels_constexprs():
    """A kernel that gains a constexpr parameter gains it in every case here too (`signature` names what is missing)."""
    for kernel, constexprs, *types in cases():
        signature(kernel, constexprs, *types or [{}])


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS))
def test_kernels_compile_for_sm90(part):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, __file__, str(part)], env=env, capture_output=True, text=True, timeout=1200)
    if run.returncode != 0 and "ptxas" in run.stdout and "No such file" in run.stdout:
        pytest.skip(f"this triton install has no ptxas to assemble sm_90 code: {run.stdout[-300:]}")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


if __name__ == "__main__":
    chosen = cases()[int(sys.argv[1])::PARTS]  # this part: every PARTS-th case
    problems = compile_cases(chosen)
    print("\n".join(problems) or f"{len(chosen)} kernel variants compiled for sm_90")
    sys.exit(1 if problems else 0)

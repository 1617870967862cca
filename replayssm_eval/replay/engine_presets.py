"""Engine presets: named configs that reproduce a serving engine's shipped or proposed state numerics.

`ReplayConfig.parse("vllm:fp16sr")` resolves a preset to its expansion (options after the name are
appended: `vllm:fp16sr#seed=3`); `replayssm-eval formats --presets` lists them. Each preset names the
public source it follows and what of the engine's stored bits it reproduces (`engine_bits`: "yes", given
the engine's seed as `seed` and the state's offset in its cache as `offset`, or "statistically only,
because ..."; docs/engine_numerics.md). Window 1 is the engine's conventional decoding with a stored
state; a ReplaySSM preset keeps its ring in the activation dtype with `#buf=bf16`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnginePreset:
    name: str  # engine:choice
    expansion: str  # the ReplayConfig string
    source: str  # repository and file or pull request
    description: str
    engine_bits: str  # bit-identical to the engine: "yes" where it is, else "statistically only, because ..."


_OPEN_PR = ("statistically only, because the pull request is open and its kernel is not in the public sources read "
            "here: its description fixes the scale group and round-clamp-cast order, not the scale's operand order")
# the stochastic presets whose engines' random words are unread or not Philox: one call per 4 elements of a row
_QUAD = ("; here one Philox4x32 call per 4 elements of a row (`words=quad`): uniform words like one call an element's, "
         "for a quarter of the Philox work")
PRESETS = {p.name: p for p in (
    EnginePreset("vllm:fp16sr", "fp16sr:words=pair", "vllm-project/vllm#35753 (vllm/model_executor/layers/mamba/ops/mamba_ssm.py)",
                 "FP16 SSM cache with stochastic rounding: cvt.rs.f16x2.f32 through Triton's pack=2, Philox "
                 "(cache_philox_rounds; 0 means Triton's default 10) at each element's offset in the cache",
                 "yes, with our seed in place of the per-call torch.randint seed and `offset` set to the state's "
                 "offset in the cache, assuming the cvt.rs subnormal model of `formats.rounding` (untested on SM100)"),
    EnginePreset("vllm:fp8", "fp8:scale=row", "vllm-project/vllm#40012 (vllm/model_executor/layers/mamba/ops/mamba_ssm.py)",
                 "FP8 E4M3 state, one FP32 scale amax/448 per (head, head_dim) row, round to nearest", _OPEN_PR),
    EnginePreset("vllm:fp8sr", "fp8sr:scale=row,words=quad",
                 "vllm-project/vllm#40012 (vllm/model_executor/layers/mamba/ops/mamba_ssm.py)",
                 "FP8 E4M3 state with per-row scales and stochastic rounding on the store",
                 _OPEN_PR + "; the word layout of its cvt.rs.satfinite.e4m3x4.f32 store is unread too" + _QUAD),
    EnginePreset("vllm:int8", "int8:scale=row", "vllm-project/vllm#40012 and #52962",
                 "INT8 state, one FP32 scale amax/127 per (head, head_dim) row, round to nearest", _OPEN_PR),
    EnginePreset("vllm:int16", "int16:scale=row", "vllm-project/vllm#40012 (vllm/model_executor/layers/mamba/ops/mamba_ssm.py)",
                 "INT16 state, one FP32 scale per (head, head_dim) row, round to nearest", _OPEN_PR),
    EnginePreset("vllm:int16sr", "int16sr:scale=row,words=quad",
                 "vllm-project/vllm#40012 (vllm/model_executor/layers/mamba/ops/mamba_ssm.py)",
                 "INT16 state with per-row scales and stochastic rounding floor(x + U[0, 1))",
                 _OPEN_PR + "; how it draws U[0, 1) is unread too" + _QUAD),
    EnginePreset("vllm:replay-fp16sr", "shared:fp16sr:words=pair#buf=bf16",
                 "vllm-project/vllm#48018 and #48792 (selective_state_update_replayssm_output_only.py, "
                 "gdn_replayssm_spec_decode.py)",
                 "ReplaySSM: one FP16+SR checkpoint, ring in the activation dtype (bf16): Mamba-2 x, B and the "
                 "fold's B * dt * decay; GDN k, beta and u",
                 "yes for the Mamba-2 flush store (convert_rs_fp16x2 at cache offsets, as vllm:fp16sr); no for "
                 "GDN, whose spec-decode flush stores the checkpoint cast to the activation dtype (round to "
                 "nearest bf16, `shared:bf16#buf=bf16`), with no stochastic rounding"),
    EnginePreset("vllm:replay-fp8sr", "shared:fp8sr:scale=row,words=quad#buf=bf16", "vllm-project/vllm#52962",
                 "FlashInfer ReplaySSM with an FP8+SR checkpoint, one scale per (head, head_dim), bf16 ring",
                 _OPEN_PR + _QUAD),
    EnginePreset("sglang:fp16sr", "fp16sr:words=pair", "sgl-project/sglang#26929 (--enable-mamba-cache-stochastic-rounding)",
                 "FP16 SSM cache with Philox stochastic rounding (--mamba-cache-philox-rounds, 0 means 10) on "
                 "--mamba-backend triton: vLLM's cvt.rs.f16x2.f32 pack=2 store; --mamba-backend flashinfer is "
                 "flashinfer:fp16sr",
                 "yes, as vllm:fp16sr (the same Triton store, seed and cache-offset counters)"),
    EnginePreset("sglang:fp8", "fp8:scale=tile:32x0,max=240", "sgl-project/sglang#40706 (--mamba-ssm-dtype float8)",
                 "FP8 E4M3 GDN state, one FP32 scale amax/240 per (head, 32 V rows x K) tile (the formats see a GDN "
                 "state as [HV, V, K])",
                 "statistically only, because #40706 is a feature request with no kernel in the public sources: "
                 "it fixes one FP32 scale amax/240 per (head, 32-row V tile x K) and E4M3 codes, which this "
                 "preset follows, not the operand order or rounding (here x / (amax / 240), ties to even)"),
    EnginePreset("sglang:int8-pool", "fp32#rt=int8:axis=headdim,scale=row@prompt",
                 "sgl-project/sglang#28185 (python/sglang/srt/mem_cache/int8_checkpoint_store.py, "
                 "--enable-int8-mamba-checkpoint)",
                 "prefix-cache INT8 checkpoint pool: the state at the prompt's end stored as INT8 with one FP32 scale "
                 "amax / 127 per (head, key channel) (amax over V), round half to even, restored on a cache hit; "
                 "decoding continues in FP32 (give another config's #rt the same format to combine)",
                 "yes for the codes and scales of an FP32 pool where every key channel's amax is at least 1e-8 (SGLang "
                 "clamps smaller ones to 1e-8); statistically only for a bf16 pool, whose scale SGLang rounds to bf16"),
    EnginePreset("flashinfer:int16", "int16:scale=row,order=mul",
                 "flashinfer-ai/flashinfer#2645 (include/flashinfer/mamba/kernel_selective_state_update_stp.cuh)",
                 "INT16 state with one FP32 decode scale per head_dim row in FlashInfer's order: enc = 32767 / amax, "
                 "code = rn(clamp(x * enc)), dec = 1 / enc",
                 "yes where FlashInfer's two divisions are correctly rounded: its JIT builds with -use_fast_math, so "
                 "32767 / amax and 1 / enc are approximate divisions whose results may differ by an ulp in some rows "
                 "(and subnormal products flush); operand order, NaN and Inf handling and ties are bit-identical"),
    EnginePreset("flashinfer:fp16sr", "fp16sr:words=quad",
                 "flashinfer-ai/flashinfer#2645 (include/flashinfer/mamba/kernel_selective_state_update_stp.cuh)",
                 "selective_state_update with an FP16 state and Philox stochastic rounding: one Philox4x32 call per "
                 "4 elements of a row at the first one's cache offset, cvt.rs (SM100)",
                 "yes for the simple decode kernel with d_state >= 128 on SM100, with our seed for its rand_seed and "
                 "`offset` the state's offset in the cache (`fp16sr:words=duo` for d_state 64 and for the "
                 "SM90 vertical kernel); statistically only for the SM90 horizontal kernel, which draws at "
                 "bank-permuted columns"),
    EnginePreset("flashinfer:fp16sr-sm90", "fp16sr:words=quad,cvt=soft",
                 "flashinfer-ai/flashinfer#2645 (include/flashinfer/mamba/conversion.cuh, cvt_rs_f16_sw)",
                 "flashinfer:fp16sr on GPUs without cvt.rs (H100, H200): FlashInfer's integer software port, which "
                 "flushes fp16 subnormal results to zero",
                 "yes for the simple decode kernel with d_state >= 128, as flashinfer:fp16sr (`fp16sr:words=duo,"
                 "cvt=soft` for d_state 64 and the vertical kernel)"),
    EnginePreset("trtllm:fp16sr", "fp16sr:words=quad", "NVIDIA/TensorRT-LLM#11972 (mamba_ssm_stochastic_rounding, mamba_ssm_philox_rounds)",
                 "FP16 Mamba SSM cache with Philox stochastic rounding, 10 rounds by default; stochastic rounding "
                 "runs only through FlashInfer's selective_state_update (fp16 cache)",
                 "yes where FlashInfer's is (flashinfer:fp16sr; flashinfer:fp16sr-sm90 on H100 and H200), with our "
                 "seed for the per-call one"),
    EnginePreset("trtllm:replay-fp16sr", "shared:fp16sr:words=octet#buf=bf16", "NVIDIA/TensorRT-LLM#14203 and #13725",
                 "ReplaySSM with an FP16+SR checkpoint; x and B buffered in the activation dtype, dt in FP32, the "
                 "fold's dt * decay * B cast to bf16 before its dot (replay_selective_state_update.py); the flush "
                 "draws tl.randint4x at every 8th element's cache offset and spreads the 4 words over 4 pairs",
                 "yes for the flush store, with our seed for the per-call one and `offset` the state's offset in "
                 "the cache"),
    EnginePreset("modelopt:int8-hadamard", "shared:int8:axis=headdim,scale=block:32,rot=hadamard:32@8",
                 "NVIDIA/Model-Optimizer docs/linear_attention_decode.md (decode.state_codec='int8_hadamard32')",
                 "INT8 replay anchor in a 32-point Hadamard basis along the value dim, one scale per key channel "
                 "and 32 values (ModelOpt stores FP16 scales), window 8 as in its example",
                 "statistically only, because ModelOpt floors the scale at 6e-8, rounds ties away from zero, "
                 "reconstructs with the scale rounded to FP16 and rotates in its own FP32 arithmetic (here: no "
                 "floor, ties to even, FP32 scales, FP64 rotation rounded once); elsewhere the codes agree"),
    EnginePreset("pimba:mx8sr", "mx8sr:words=quad",
                 "Kim et al., Pimba, MICRO '25, Sections 3.2 and 4.2 (casys-kaist/pimba, src/pimba/accuracy/quants/mx8.py)",
                 "the paper's state format: MX8 (16 values share an 8-bit exponent, each pair a 1-bit microexponent, "
                 "sign and 6-bit mantissa) with stochastic rounding, the state stored every step (its Eq. 2)",
                 "statistically only, because the paper draws its random bits from an LFSR (its accuracy code: "
                 "Triton's tl.randint, one word an element, 8 bits added below the rounding point, as here); a "
                 "magnitude rounding up to 64 steps saturates at 63 here and carries into the exponent in that code; "
                 "elsewhere the values agree" + _QUAD),
    EnginePreset("pimba:mx8", "mx8",
                 "Kim et al., Pimba, MICRO '25, Section 3.2 (casys-kaist/pimba, src/pimba/accuracy/quants/mx8.py)",
                 "MX8 state with round to nearest, ties away from zero (the paper's format without stochastic "
                 "rounding)",
                 "yes but where a magnitude rounds up to 64 steps (saturating at 63 here, carrying into the "
                 "exponent in the paper's accuracy code) and in blocks of values below 2^-119, where that code "
                 "gives zeros and subnormals an implicit leading one"),
    EnginePreset("pimba:int8sr", "int8sr:scale=block:32,words=quad",
                 "Kim et al., Pimba, MICRO '25, Section 3.2 (casys-kaist/pimba, src/pimba/accuracy/quants/int8.py)",
                 "the paper's INT8 state: one scale amax / 127 per 32 elements along d_state, stochastic rounding "
                 "(the paper's most accurate 8-bit state, Figure 4)",
                 "statistically only, because the paper fixes the scale group and the rounding's distribution, not "
                 "the scale's precision or the random bits (its accuracy code rounds amax to bf16 and adds "
                 "tl.rand - 0.5 before rounding half away from zero)" + _QUAD),
    EnginePreset("stepquant:dualaxis6", "dualaxis",
                 "Yao, Xu, Lin et al., STEPQuant, arXiv 2609.38169, Section 4.3 and Appendix C.1 (Eq. 11-14)",
                 "STEPQuant's Key-Row-Aware Dual-axis Fitting at its nominal 6 bits: one FP16 factor per key row "
                 "(sqrt of the row's mean magnitude) and per value column (a weighted least-squares fit), the "
                 "state stored every step (its Eq. 4); without the paper's calibrated row impact, lifetime-aware "
                 "bit allocation and FP16 pivots",
                 "statistically only, because the paper's SGLang kernel refits the column factors from the previous "
                 "step's and calibrates row-impact factors and per-head widths; here each store starts from the "
                 "column maxima with one fixed-code update, uniform row impact and one width"),
    EnginePreset("stepquant:dualaxis8", "dualaxis:width=8",
                 "Yao, Xu, Lin et al., STEPQuant, arXiv 2609.38169, Section 4.3 and Appendix C.1 (Eq. 11-14)",
                 "stepquant:dualaxis6 with 8-bit codes, the paper's widest integer candidate",
                 "statistically only, as stepquant:dualaxis6"),
)}

ENGINES = tuple(sorted({name.partition(":")[0] for name in PRESETS}))


def is_preset(text: str) -> bool:
    """True when `text` names an engine preset (engine:choice, options after it allowed)."""
    return text.partition(":")[0] in ENGINES


def expand(text: str) -> str:
    """The ReplayConfig string of a preset `engine:choice[#option...]`; the options follow the expansion."""
    name, sep, options = text.partition("#")
    preset = PRESETS.get(name.strip())
    if preset is None:
        raise ValueError(f"unknown engine preset {name.strip()!r}; known: {', '.join(PRESETS)}")
    return preset.expansion + sep + options

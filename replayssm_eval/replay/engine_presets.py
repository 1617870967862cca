"""Engine presets: named configs that reproduce a serving engine's shipped or proposed state numerics.

`ReplayConfig.parse("vllm:fp16sr")` resolves a preset to its expansion (options after the name are
appended: `vllm:fp16sr#seed=3`); `replayssm-eval formats --presets` lists them. Each preset names
the public source it follows. Window 1 is the engine's conventional decoding with a stored state;
a ReplaySSM preset keeps its ring in the activation dtype with `#buf=bf16`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnginePreset:
    name: str  # engine:choice
    expansion: str  # the ReplayConfig string
    source: str  # repository and file or pull request
    description: str


PRESETS = {p.name: p for p in (
    EnginePreset("vllm:fp16sr", "fp16sr", "vllm-project/vllm#35753 (vllm/model_executor/layers/mamba/ops/mamba_ssm.py)",
                 "FP16 SSM cache with Philox stochastic rounding (stochastic_rounding_philox_rounds, 10 rounds)"),
    EnginePreset("vllm:fp8", "fp8:scale=row", "vllm-project/vllm#40012 (vllm/model_executor/layers/mamba/ops/mamba_ssm.py)",
                 "FP8 E4M3 state, one FP32 scale amax/448 per (head, head_dim) row, round to nearest"),
    EnginePreset("vllm:fp8sr", "fp8sr:scale=row", "vllm-project/vllm#40012 (vllm/model_executor/layers/mamba/ops/mamba_ssm.py)",
                 "FP8 E4M3 state with per-row scales and stochastic rounding on the store"),
    EnginePreset("vllm:int8", "int8:scale=row", "vllm-project/vllm#40012 and #52962",
                 "INT8 state, one FP32 scale amax/127 per (head, head_dim) row, round to nearest"),
    EnginePreset("vllm:int16", "int16:scale=row", "vllm-project/vllm#40012 (vllm/model_executor/layers/mamba/ops/mamba_ssm.py)",
                 "INT16 state, one FP32 scale per (head, head_dim) row, round to nearest"),
    EnginePreset("vllm:int16sr", "int16sr:scale=row", "vllm-project/vllm#40012 (vllm/model_executor/layers/mamba/ops/mamba_ssm.py)",
                 "INT16 state with per-row scales and stochastic rounding floor(x + U[0, 1))"),
    EnginePreset("vllm:replay-fp16sr", "shared:fp16sr#buf=bf16",
                 "vllm-project/vllm#48018 and #48792 (selective_state_update_replayssm_output_only.py, "
                 "gdn_replayssm_spec_decode.py)",
                 "ReplaySSM: one FP16+SR checkpoint, ring in the activation dtype (bf16): Mamba-2 x, B and the "
                 "fold's B * dt * decay; GDN k, beta and u"),
    EnginePreset("vllm:replay-fp8sr", "shared:fp8sr:scale=row#buf=bf16", "vllm-project/vllm#52962",
                 "FlashInfer ReplaySSM with an FP8+SR checkpoint, one scale per (head, head_dim), bf16 ring"),
    EnginePreset("sglang:fp16sr", "fp16sr", "sgl-project/sglang#26929 (--enable-mamba-cache-stochastic-rounding)",
                 "FP16 SSM cache with Philox stochastic rounding (--mamba-cache-philox-rounds)"),
    EnginePreset("sglang:fp8", "fp8:scale=head,max=240", "sgl-project/sglang#40706 (--mamba-ssm-dtype float8)",
                 "FP8 E4M3 GDN state, scale amax/240; the request scales each (head, 32 V rows x K) tile, here one "
                 "scale per head (the same when V = 32)"),
    EnginePreset("sglang:int8-pool", "fp32#rt=int8:axis=headdim,scale=row@prompt",
                 "sgl-project/sglang#28185 (python/sglang/srt/mem_cache/int8_checkpoint_store.py, "
                 "--enable-int8-mamba-checkpoint)",
                 "prefix-cache INT8 checkpoint pool: the state at the prompt's end stored as INT8 with one FP32 scale "
                 "amax / 127 per (head, key channel) (amax over V), round half to even, restored on a cache hit; "
                 "decoding continues in FP32 (give another config's #rt the same format to combine)"),
    EnginePreset("flashinfer:int16", "int16:scale=row",
                 "flashinfer-ai/flashinfer#2645 (include/flashinfer/mamba/kernel_selective_state_update_stp.cuh)",
                 "INT16 state with one FP32 decode scale per head_dim row (Philox SR applies to FP16 states there)"),
    EnginePreset("flashinfer:fp16sr", "fp16sr",
                 "flashinfer-ai/flashinfer#2645 (include/flashinfer/mamba/kernel_selective_state_update_stp.cuh)",
                 "selective_state_update with an FP16 state and Philox stochastic rounding"),
    EnginePreset("trtllm:fp16sr", "fp16sr", "NVIDIA/TensorRT-LLM#11972 (mamba_ssm_stochastic_rounding, mamba_ssm_philox_rounds)",
                 "FP16 Mamba SSM cache with Philox stochastic rounding, 10 rounds by default"),
    EnginePreset("trtllm:replay-fp16sr", "shared:fp16sr#buf=bf16", "NVIDIA/TensorRT-LLM#14203 and #13725",
                 "ReplaySSM with an FP16+SR checkpoint; x and B buffered in the activation dtype, dt in FP32, the "
                 "fold's dt * decay * B cast to bf16 before its dot (replay_selective_state_update.py)"),
    EnginePreset("modelopt:int8-hadamard", "shared:int8:axis=headdim,scale=block:32,rot=hadamard:32@8",
                 "NVIDIA/Model-Optimizer docs/linear_attention_decode.md (decode.state_codec='int8_hadamard32')",
                 "INT8 replay anchor in a 32-point Hadamard basis along the value dim, one scale per key channel "
                 "and 32 values (ModelOpt stores FP16 scales), window 8 as in its example"),
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

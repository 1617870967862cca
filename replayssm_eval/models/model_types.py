"""The Hugging Face model types whose SSM layers we route: one table, `MODEL_TYPES`.

A model type is a transformers modeling module (`transformers.models.<type>.modeling_<type>`) that
defines an SSM mixer and binds, as module globals, the scan functions that `routing` replaces. Its
row names those functions, the kernel family that runs them (`kernels.family`), and the config
attributes its SSM geometry is read from (`presets.geometry_from_config`).

The six Mamba-2 model types call the same two functions with the same arguments (checked against
transformers 5.17 and 5.24: falcon_h1's mup multipliers and its optional z gate sit outside the
scan, zamba2's mixer is the same torch math as nemotron_h's), so one hook pair serves them all.
A mixer is recognised by where its class is defined and by its parameters (A_log, dt_bias, an int
layer_idx), not by class name, so a renamed class in a later transformers still matches. The
decay parameters sit on the mixer itself, or on a child module without a layer index of its own
(kimi_linear's forget gate).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from replayssm_eval.kernels.family import KernelFamily, get_family


@dataclass(frozen=True)
class ModelType:
    """One routed model type. scans: (chunk function, one-token function), the module globals the hooks rebind;
    geometry_fields: the config attributes of (heads, head_dim, state_dim, groups, conv kernel) in
    `presets.ModelGeometry`'s terms."""

    model_type: str
    family: str  # the kernel family's name
    scans: tuple[str, str]
    geometry_fields: tuple[str, str, str, str, str]

    @property
    def module(self) -> str:
        return f"transformers.models.{self.model_type}.modeling_{self.model_type}"

    @property
    def kernels(self) -> KernelFamily:
        return get_family(self.family)


_MAMBA2 = ("mamba2_chunk_scan", "mamba2_selective_state_update")
_GDN = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
_KDA = ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention")
# GDN layers: (value heads, value dim, key dim, key heads, conv kernel); the state is K x V
_GDN_FIELDS = ("linear_num_value_heads", "linear_value_head_dim", "linear_key_head_dim", "linear_num_key_heads",
               "linear_conv_kernel_dim")
MODEL_TYPES = {row.model_type: row for row in (
    # Mamba-2 mixers: (heads, head_dim, d_state, n_groups, conv kernel)
    ModelType("nemotron_h", "mamba2", _MAMBA2,
              ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel")),
    ModelType("mamba2", "mamba2", _MAMBA2, ("num_heads", "head_dim", "state_size", "n_groups", "conv_kernel")),
    ModelType("bamba", "mamba2", _MAMBA2,
              ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv")),
    ModelType("granitemoehybrid", "mamba2", _MAMBA2,
              ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv")),
    ModelType("falcon_h1", "mamba2", _MAMBA2,
              ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv")),
    ModelType("zamba2", "mamba2", _MAMBA2,
              ("n_mamba_heads", "mamba_headdim", "mamba_d_state", "mamba_ngroups", "mamba_d_conv")),
    # Qwen3.5 / Qwen3-Next layers, and OLMo-Hybrid's with allow_neg_eigval (beta in [0, 2])
    ModelType("qwen3_5", "gdn", _GDN, _GDN_FIELDS),
    ModelType("qwen3_5_moe", "gdn", _GDN, _GDN_FIELDS),
    ModelType("qwen3_next", "gdn", _GDN, _GDN_FIELDS),
    ModelType("olmo_hybrid", "gdn", _GDN, _GDN_FIELDS),
    # KDA layers: (heads, head dim = V, head dim = K, heads, conv kernel); one head dim for q, k and v
    ModelType("kimi_linear", "kda", _KDA,
              ("linear_num_heads", "linear_head_dim", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim")),
)}

# text-only configs of the multimodal Qwen3.5 checkpoints use the same modeling module
ALIASES = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}
NOT_SUPPORTED = {
    "mamba": "Mamba-1 has a per-channel diagonal state, not the Mamba-2 scalar-decay heads our kernels take",
    "falcon_mamba": "Mamba-1 mixer (see mamba)",
    "jamba": "Mamba-1 mixer (see mamba)",
}


def model_type_of(config) -> ModelType:
    """The row of an HF config's model type; ValueError listing the supported model types otherwise."""
    model_type = ALIASES.get(config.model_type, config.model_type)
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    reason = f" ({NOT_SUPPORTED[model_type]})" if model_type in NOT_SUPPORTED else ""
    supported = ", ".join([*MODEL_TYPES, *ALIASES])
    raise ValueError(f"unsupported model type {config.model_type!r}{reason}; supported: {supported}")


def find_ssm_layers(model: nn.Module, model_type: ModelType) -> dict[int, nn.Module]:
    """{layer_idx: mixer} of every SSM mixer of `model_type` in `model`; ValueError if there is none."""
    layers: dict[int, nn.Module] = {}
    for name, module in model.named_modules():
        if type(module).__module__ != model_type.module or not _is_mixer(module):
            continue
        if module.layer_idx in layers:
            raise ValueError(f"two SSM mixers claim layer_idx {module.layer_idx} (second: {name})")
        layers[module.layer_idx] = module
    if not layers:
        raise ValueError(
            f"no {model_type.family} SSM layers found in this {model_type.model_type} model (looked for mixers defined in "
            f"{model_type.module}); a trust_remote_code model or a model without SSM layers cannot be routed"
        )
    return dict(sorted(layers.items()))


def _is_mixer(module: nn.Module) -> bool:
    if not isinstance(getattr(module, "layer_idx", None), int):
        return False
    holders = (module, *(child for child in module.children() if not hasattr(child, "layer_idx")))
    return any({"A_log", "dt_bias"} <= dict(h.named_parameters(recurse=False)).keys() for h in holders)

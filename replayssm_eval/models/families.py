"""The Hugging Face model families whose SSM layers we route, and how their layers are found.

A family is a transformers modeling module (`transformers.models.<type>.modeling_<type>`) that
defines an SSM mixer and binds, as module globals, the scan functions that `routing` replaces;
which functions, and which kernel family runs them, is the kernel family's `hf_scans`
(`kernels.family`).

The six Mamba-2 families call the same two functions with the same arguments (checked against
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

from replayssm_eval.kernels.family import KernelFamily, all_families


@dataclass(frozen=True)
class Family:
    model_type: str
    kernels: KernelFamily

    @property
    def module(self) -> str:
        return f"transformers.models.{self.model_type}.modeling_{self.model_type}"

    @property
    def scans(self) -> tuple[str, str]:
        """(chunk function, one-token function): the module globals the hooks rebind."""
        return self.kernels.hf_scans[self.model_type]


FAMILIES = {model_type: Family(model_type, fam) for fam in all_families() for model_type in fam.hf_scans}
# text-only configs of the multimodal Qwen3.5 checkpoints use the same modeling module
ALIASES = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}
NOT_SUPPORTED = {
    "mamba": "Mamba-1 has a per-channel diagonal state, not the Mamba-2 scalar-decay heads our kernels take",
    "falcon_mamba": "Mamba-1 mixer (see mamba)",
    "jamba": "Mamba-1 mixer (see mamba)",
}


def family_of(config) -> Family:
    """The family of an HF config; ValueError listing the supported model types otherwise."""
    model_type = ALIASES.get(config.model_type, config.model_type)
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    reason = f" ({NOT_SUPPORTED[model_type]})" if model_type in NOT_SUPPORTED else ""
    supported = ", ".join([*FAMILIES, *ALIASES])
    raise ValueError(f"unsupported model type {config.model_type!r}{reason}; supported: {supported}")


def find_ssm_layers(model: nn.Module, family: Family) -> dict[int, nn.Module]:
    """{layer_idx: mixer} of every SSM mixer of `family` in `model`; ValueError if there is none."""
    layers: dict[int, nn.Module] = {}
    for name, module in model.named_modules():
        if type(module).__module__ != family.module or not _is_mixer(module):
            continue
        if module.layer_idx in layers:
            raise ValueError(f"two SSM mixers claim layer_idx {module.layer_idx} (second: {name})")
        layers[module.layer_idx] = module
    if not layers:
        raise ValueError(
            f"no {family.kernels.name} SSM layers found in this {family.model_type} model (looked for mixers defined in "
            f"{family.module}); a trust_remote_code model or a model without SSM layers cannot be routed"
        )
    return dict(sorted(layers.items()))


def _is_mixer(module: nn.Module) -> bool:
    if not isinstance(getattr(module, "layer_idx", None), int):
        return False
    holders = (module, *(child for child in module.children() if not hasattr(child, "layer_idx")))
    return any({"A_log", "dt_bias"} <= dict(h.named_parameters(recurse=False)).keys() for h in holders)

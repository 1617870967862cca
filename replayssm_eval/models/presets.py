"""SSM geometry of the paper's four models, and of any supported Hugging Face config.

A `ModelGeometry` holds what sizes the recurrent state; the memory-traffic and state-size
numbers reported beside every accuracy number are computed from it. Per head the state is

    mamba2:  head_dim x d_state   (P x N), heads = Mamba-2 heads, groups share B and C
    gdn:     key_dim x value_dim  (K x V, Hugging Face layout), heads = value heads,
             groups = key heads (each serves heads / groups value heads)
    kda:     key_dim x value_dim  (K x V, as gdn), heads = groups = KDA heads (no grouping)

Field values of the presets come from the sources cited beside them; None marks a value no
source available here gave.
"""

import dataclasses

from transformers import KimiLinearConfig, NemotronHConfig, PretrainedConfig, Qwen3_5TextConfig

from replayssm_eval.kernels.family import family_names, get_family
from replayssm_eval.models.model_types import model_type_of

# layer_types entries whose layer holds an SSM state ("hybrid": zamba2/falcon_h1 layers with both mixers)
_SSM_LAYER_TYPES = ("linear_attention", "mamba", "hybrid")

@dataclasses.dataclass(frozen=True)
class ModelGeometry:
    """SSM geometry of one model; None marks an unknown value (see the module docstring)."""

    name: str
    family: str  # a kernel family's name (`kernels.family`)
    num_layers: int | None
    num_ssm_layers: int | None
    num_heads: int | None  # Mamba-2 heads | GDN value heads
    head_dim: int | None  # Mamba-2 P | GDN value dim V
    state_dim: int | None  # Mamba-2 d_state N | GDN key dim K
    n_groups: int | None  # Mamba-2 B/C groups | GDN key heads
    conv_kernel: int | None
    vocab_size: int | None
    hidden_size: int | None

    def __post_init__(self):
        if self.family not in family_names():
            raise ValueError(f"unknown SSM family {self.family!r}; known: {', '.join(family_names())}")

    def _need(self, *fields: str) -> None:
        unknown = [f for f in fields if getattr(self, f) is None]
        if unknown:
            raise ValueError(f"{self.name}: {', '.join(unknown)} unknown, so this size cannot be computed")

    @property
    def head_state_shape(self) -> tuple[int, int]:
        """One head's state in the family's HF layout: (head_dim, d_state) for mamba2, (key_dim, value_dim) for gdn."""
        self._need("head_dim", "state_dim")
        return get_family(self.family).head_state(self.head_dim, self.state_dim)

    @property
    def state_elements_per_layer(self) -> int:
        """Elements of one layer's state for one sequence: heads x rows x cols."""
        self._need("num_heads", "head_dim", "state_dim")
        rows, cols = self.head_state_shape
        return self.num_heads * rows * cols

    def state_bytes_per_layer(self, bits: float = 32) -> float:
        """Bytes of one layer's state for one sequence at `bits` per element (scales not counted)."""
        return self.state_elements_per_layer * bits / 8

    @property
    def format_state_shape(self) -> tuple[int, int, int]:
        """One layer's state of one sequence in the formats' layout: (heads, head_dim, state_dim), i.e. Mamba-2
        [H, P, N], GDN and KDA [HV, V, K]."""
        self._need("num_heads", "head_dim", "state_dim")
        return self.num_heads, self.head_dim, self.state_dim

    def state_bytes_per_sequence(self, bits: float = 32) -> float:
        """Bytes of all SSM layers' state for one sequence at `bits` per element."""
        self._need("num_ssm_layers")
        return self.num_ssm_layers * self.state_bytes_per_layer(bits)


PRESETS: dict[str, ModelGeometry] = {
    # docs/semantics.md, The method (96 heads x 80 x 128, state 3.75 MiB/layer FP32).
    # Layer counts 42 layers = 21 Mamba-2 + 4 attention + 17 MLP, hidden 3136, n_groups 8, conv 4,
    # vocab 131072: HF config.json at revision dfaf35de3e30f1867dd8dbc38a7fc9fb52d3914f as quoted
    # in a public architecture brief (search corpus: "Nemotron-3 architecture brief for the SmolBench
    # family ladder"); the census 21/4/17 also appears in NVIDIA's HF blog post on the model.
    "nemotron-3-nano-4b": ModelGeometry(
        name="nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16", family="mamba2", num_layers=42, num_ssm_layers=21,
        num_heads=96, head_dim=80, state_dim=128, n_groups=8, conv_kernel=4, vocab_size=131072, hidden_size=3136,
    ),
    # Same brief, for NVIDIA-Nemotron-3-Super-120B-A12B-BF16 @ d51eab0d: 88 layers = 40 Mamba-2 +
    # 40 LatentMoE + 8 attention; Mamba-2 128 heads x 64 x 128, 8 groups; hidden 4096. The NVFP4
    # release is assumed to share this architecture (NVFP4 quantizes weights, not the layout).
    "nemotron-3-super-120b-a12b": ModelGeometry(
        name="nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4", family="mamba2", num_layers=88, num_ssm_layers=40,
        num_heads=128, head_dim=64, state_dim=128, n_groups=8, conv_kernel=4, vocab_size=131072, hidden_size=4096,
    ),
    # GDN: 32 value heads, 16 key heads, K = V = 128. 32 layers = 24 GDN + 8 full
    # attention (full_attention_interval 4), hidden 2560, conv 4, vocab 248320: the GGUF metadata
    # of Qwen3.5-4B listed in github.com/quantumaikr/quant.cpp/issues/94.
    "qwen3.5-4b": ModelGeometry(
        name="Qwen/Qwen3.5-4B", family="gdn", num_layers=32, num_ssm_layers=24,
        num_heads=32, head_dim=128, state_dim=128, n_groups=16, conv_kernel=4, vocab_size=248320, hidden_size=2560,
    ),
    # 48 layers = 36 GDN + 12 full attention, vocab 248320: model cards of its quantized releases
    # (btbtyler09/Qwen3.5-122B-A10B-GPTQ-4bit, olka-fi/Qwen3.5-122B-A10B-MXFP4). Its GDN head
    # counts and hidden size were in no source found here: unknown. The conv kernel is 4 in every
    # Qwen3.5 config seen, but not confirmed for this one: unknown.
    "qwen3.5-122b-a10b": ModelGeometry(
        name="Qwen/Qwen3.5-122B-A10B", family="gdn", num_layers=48, num_ssm_layers=36,
        num_heads=None, head_dim=None, state_dim=None, n_groups=None, conv_kernel=None, vocab_size=248320, hidden_size=None,
    ),
    # KDA: 32 heads, K = V = 128. 27 layers = 20 KDA + 7 MLA (full_attn_layers 4, 8, ..., 24, 27, 1-based),
    # hidden 2304, short conv 4, vocab 163840: config.json of Firworks/Kimi-Linear-48B-A3B-Instruct-nvfp4 on the
    # Hugging Face hub (an NVFP4 weight quantization of this model; its architecture fields are the original's).
    "kimi-linear-48b-a3b": ModelGeometry(
        name="moonshotai/Kimi-Linear-48B-A3B-Instruct", family="kda", num_layers=27, num_ssm_layers=20,
        num_heads=32, head_dim=128, state_dim=128, n_groups=32, conv_kernel=4, vocab_size=163840, hidden_size=2304,
    ),
}


def get_preset(name: str) -> ModelGeometry:
    """A preset by short name (`nemotron-3-nano-4b`) or hub id (`Qwen/Qwen3.5-4B`)."""
    for key, geometry in PRESETS.items():
        if name in (key, geometry.name):
            return geometry
    raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")


def full_size_preset(family: str) -> str:
    """The first preset of a kernel family with its whole geometry known: the full size benchmarks and GPU checks use."""
    for key, geometry in PRESETS.items():
        if geometry.family == family and None not in (geometry.num_heads, geometry.head_dim, geometry.state_dim,
                                                      geometry.n_groups):
            return key
    raise ValueError(f"no preset of the {family!r} family has a known geometry; presets: {', '.join(PRESETS)}")


def state_shape(geometry: str) -> tuple[int, int, int]:
    """(heads, head_dim, state_dim) in the formats' layout of a preset (`format_state_shape`) or of an 'H,P,N' string."""
    if geometry in PRESETS:
        return PRESETS[geometry].format_state_shape
    parts = geometry.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"unknown geometry '{geometry}'; known: {', '.join(PRESETS)}, or 'H,P,N' (positive ints)")
    return tuple(int(p) for p in parts)


def geometry_from_config(hf_config: PretrainedConfig) -> ModelGeometry:
    """The SSM geometry of a Hugging Face config of any supported model type."""
    config = hf_config.get_text_config()  # the text backbone of a composite (vision-language) config
    model_type = config.model_type
    row = model_type_of(config)  # ValueError listing the supported model types
    heads, head_dim, state_dim, groups, conv = (getattr(config, f) for f in row.geometry_fields)
    layer_types = getattr(config, "layer_types", None)
    if not layer_types:
        raise ValueError(f"{model_type} config has no layer_types, so its SSM layers cannot be counted")
    return ModelGeometry(
        name=getattr(hf_config, "name_or_path", "") or model_type,
        family=row.family,
        num_layers=len(layer_types),
        num_ssm_layers=sum(t in _SSM_LAYER_TYPES for t in layer_types),
        num_heads=heads,
        head_dim=head_dim,
        state_dim=state_dim,
        n_groups=groups,
        conv_kernel=conv,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
    )


def ssm_layer_indices(hf_config: PretrainedConfig) -> list[int]:
    """The HF layer indices of the SSM layers of a config of any supported model type (from its layer_types)."""
    config = hf_config.get_text_config()
    layer_types = getattr(config, "layer_types", None)
    if not layer_types:
        raise ValueError(f"{config.model_type} config has no layer_types, so its SSM layers cannot be found")
    return [i for i, t in enumerate(layer_types) if t in _SSM_LAYER_TYPES]


# Nemotron-3-Nano-4B layer pattern (M Mamba-2, - MLP, * attention), from the brief cited above:
# attention at layers 12, 17, 24, 32.
_NEMOTRON_3_NANO_4B_PATTERN = "M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M-"
# Kimi-Linear-48B-A3B MLA layers, 1-based as in its config.json (the source cited at its preset)
_KIMI_LINEAR_48B_MLA_LAYERS = (4, 8, 12, 16, 20, 24, 27)


def full_size_config(name: str) -> PretrainedConfig:
    """A config of the full-size architecture, for random-weight speed tests (no download).

    nemotron-3-nano-4b: the preset's Mamba-2 geometry; attention 40 query / 8 KV heads x 128, MLP
    3136 -> 12544 (relu2), chunk 256 (same brief). qwen3.5-4b: the preset's GDN geometry; attention
    16 / 4 heads x 256, partial rotary 0.25, rope theta 1e7 (github.com/quantumaikr/quant.cpp/issues/94); MLP 9216 is from
    a derived checkpoint's config (huggingface.co/halen214/st01), not confirmed on Qwen's own.
    kimi-linear-48b-a3b: the preset's KDA geometry; MLA 32 heads, kv_lora_rank 512, qk_nope 128, qk_rope
    64, v 128, no q LoRA; MoE 256 experts, 8 per token, 1 shared, expert width 1024, first layer dense
    (9216) (its preset's source).
    Weights built from these are random: good for speed and memory, not for accuracy.
    """
    if name == "nemotron-3-nano-4b":
        return NemotronHConfig(
            vocab_size=131072, hidden_size=3136, hybrid_override_pattern=_NEMOTRON_3_NANO_4B_PATTERN,
            num_attention_heads=40, num_key_value_heads=8, head_dim=128, intermediate_size=12544,
            mlp_hidden_act="relu2", mamba_num_heads=96, mamba_head_dim=80, ssm_state_size=128, n_groups=8,
            conv_kernel=4, chunk_size=256, max_position_embeddings=262144, tie_word_embeddings=False,
        )
    if name == "qwen3.5-4b":
        return Qwen3_5TextConfig(
            vocab_size=248320, hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
            layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 8, num_attention_heads=16,
            num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
            linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
            max_position_embeddings=262144, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        )
    if name == "kimi-linear-48b-a3b":
        layers = 27
        return KimiLinearConfig(
            vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024,
            num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512,
            q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_local_experts=256,
            num_experts_per_tok=8, n_shared_experts=1, linear_num_heads=32, linear_head_dim=128,
            linear_conv_kernel_dim=4, model_max_length=1048576, tie_word_embeddings=False,
            layer_types=["full_attention" if i + 1 in _KIMI_LINEAR_48B_MLA_LAYERS else "linear_attention"
                         for i in range(layers)],
            mlp_layer_types=["dense"] + ["sparse"] * (layers - 1),
        )
    raise ValueError(
        f"no full-size config for {name!r}; available: nemotron-3-nano-4b, qwen3.5-4b, kimi-linear-48b-a3b"
    )

"""Tiny random-initialised models of the real Hugging Face classes, one per supported family.

`build(name)` returns the model in eval mode with its SSM layers set up so that the state matters:
slow heads (per-token decay between about 0.6 and 0.999; per channel for KDA), no D skip, and larger
mixer projections,
so that a state format visibly moves the logits and a routing bug cannot hide under the residual.
"""

import torch
import transformers as tf

VOCAB = 64
MODEL_TYPES = {  # kernel family: the model types built here
    "mamba2": ("nemotron_h", "mamba2", "bamba", "granitemoehybrid", "falcon_h1", "zamba2"),
    "gdn": ("qwen3_5", "qwen3_5_moe", "qwen3_next", "olmo_hybrid"),
    "kda": ("kimi_linear",),
}
_ATTN = {"num_attention_heads": 2, "num_key_value_heads": 1}
_MAMBA = {"mamba_n_heads": 4, "mamba_d_head": 8, "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_chunk_size": 16,
          "mamba_expand": 1}
_GDN = {"linear_key_head_dim": 8, "linear_value_head_dim": 12, "linear_num_key_heads": 2, "linear_num_value_heads": 4}
_MOE = {"moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2}


def config(name: str):
    v, h = VOCAB, 32
    return {
        "nemotron_h": lambda: tf.NemotronHConfig(
            vocab_size=v, hidden_size=h, layers_block_type=["mamba", "attention", "mamba", "mlp"], head_dim=16,
            intermediate_size=48, ssm_state_size=16, mamba_num_heads=4, mamba_head_dim=8, n_groups=2, chunk_size=16,
            tie_word_embeddings=False, **_ATTN),
        "mamba2": lambda: tf.Mamba2Config(
            vocab_size=v, hidden_size=h, num_heads=4, head_dim=8, state_size=16, num_hidden_layers=2, expand=1,
            n_groups=2, chunk_size=16),
        "bamba": lambda: tf.BambaConfig(
            vocab_size=v, hidden_size=h, intermediate_size=48, num_hidden_layers=3, attn_layer_indices=[1],
            **_ATTN, **_MAMBA),
        "granitemoehybrid": lambda: tf.GraniteMoeHybridConfig(
            vocab_size=v, hidden_size=h, intermediate_size=48, num_hidden_layers=3,
            layer_types=["mamba", "attention", "mamba"], num_local_experts=2, num_experts_per_tok=1,
            shared_intermediate_size=32, **_ATTN, **_MAMBA),
        "falcon_h1": lambda: tf.FalconH1Config(
            vocab_size=v, hidden_size=h, intermediate_size=48, num_hidden_layers=2, mamba_d_ssm=32, **_ATTN, **_MAMBA),
        "zamba2": lambda: tf.Zamba2Config(
            vocab_size=v, hidden_size=h, num_hidden_layers=3, layers_block_type=["mamba", "hybrid", "mamba"],
            mamba_d_state=16, mamba_expand=1, mamba_ngroups=2, n_mamba_heads=4, chunk_size=16, intermediate_size=48,
            num_attention_heads=2, num_key_value_heads=2, num_mem_blocks=1, adapter_rank=4),
        "qwen3_5": lambda: tf.Qwen3_5TextConfig(
            vocab_size=v, hidden_size=h, intermediate_size=48, num_hidden_layers=3, head_dim=16,
            layer_types=["linear_attention", "full_attention", "linear_attention"], **_ATTN, **_GDN),
        "qwen3_5_moe": lambda: tf.Qwen3_5MoeTextConfig(
            vocab_size=v, hidden_size=h, num_hidden_layers=3, head_dim=16,
            layer_types=["linear_attention", "full_attention", "linear_attention"], **_ATTN, **_GDN, **_MOE),
        "qwen3_next": lambda: tf.Qwen3NextConfig(
            vocab_size=v, hidden_size=h, intermediate_size=48, num_hidden_layers=3, head_dim=16,
            layer_types=["linear_attention", "full_attention", "linear_attention"], **_ATTN, **_GDN, **_MOE),
        # GDN with allow_neg_eigval: beta = 2 sigmoid(.) in (0, 2)
        "olmo_hybrid": lambda: tf.OlmoHybridConfig(
            vocab_size=v, hidden_size=h, intermediate_size=48, num_hidden_layers=3, pad_token_id=0, eos_token_id=1,
            layer_types=["linear_attention", "full_attention", "linear_attention"], linear_allow_neg_eigval=True,
            **_ATTN, **_GDN),
        # KDA heads of 8 channels, MLA attention, one MoE layer
        "kimi_linear": lambda: tf.KimiLinearConfig(
            vocab_size=v, hidden_size=h, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
            num_key_value_heads=2, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            mlp_layer_types=["dense", "sparse", "dense"], num_local_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=16, linear_num_heads=4, linear_head_dim=8, pad_token_id=0, bos_token_id=1,
            eos_token_id=2),
    }[name]()


@torch.no_grad()
def build(name: str, dtype=torch.float32, seed: int = 0):
    torch.manual_seed(seed)
    # eager experts: the grouped_mm path has no float64 kernel
    model = tf.AutoModelForCausalLM.from_config(config(name), experts_implementation="eager").eval()
    for module in model.modules():
        if not (hasattr(module, "A_log") and hasattr(module, "dt_bias")):
            continue
        heads = module.A_log.numel()
        module.A_log.copy_(torch.log(torch.rand(heads) * 0.5 + 0.01).view_as(module.A_log))
        dt = torch.exp(torch.rand(module.dt_bias.shape) * 3 - 3)  # softplus(dt_bias) in [0.05, 1], per channel for KDA
        module.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        if hasattr(module, "D"):
            module.D.zero_()
        for proj in ("in_proj", "in_proj_qkv", "in_proj_qkvz", "q_proj", "k_proj", "v_proj", "out_proj", "o_proj"):
            if hasattr(module, proj):
                getattr(module, proj).weight.mul_(8.0)
    return model.to(dtype)


def cuts(prompt: int, segments: tuple[int, ...]) -> list[tuple[int, int]]:
    """[(start, end)] of the prompt and the later calls."""
    bounds, start = [], 0
    for length in (prompt, *segments):
        bounds.append((start, start + length))
        start += length
    return bounds


@torch.no_grad()
def hf_cached_logits(model, ids: torch.Tensor, calls: list[tuple[int, int]]) -> torch.Tensor:
    """The unmodified model through its own cache path, call by call, with explicit positions."""
    import inspect

    params = inspect.signature(model.forward).parameters
    cache_arg = next(name for name in ("cache", "past_key_values", "cache_params") if name in params)
    cache = tf.DynamicCache(config=model.config)
    out = []
    for start, end in calls:
        kwargs = {cache_arg: cache, "use_cache": True}
        if "position_ids" in params:
            kwargs["position_ids"] = torch.arange(start, end).expand(ids.shape[0], -1)
        out.append(model(input_ids=ids[:, start:end], **kwargs).logits)
    return torch.cat(out, dim=1)


def forward_calls(rm, ids: torch.Tensor, calls: list[tuple[int, int]], session) -> torch.Tensor:
    """The routed model through `calls` [(start, end)] of `ids` in one session: the logits of every call, joined."""
    return torch.cat([rm.forward(ids[:, start:end], session) for start, end in calls], dim=1)

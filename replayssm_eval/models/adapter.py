"""Hugging Face hybrid models with their SSM layers routed through the ReplaySSM kernels.

    rm = load_model("tiny-nemotron-h", dtype=torch.float32, device="cpu", config="nvfp4/fp16sr")
    ref, run = rm.new_session("fp32"), rm.new_session("nvfp4/fp16sr", seq_ids=[7])
    for segment in (prompt, *segments):                  # [B, T] token ids
        p, q = rm.forward(segment, ref), rm.forward(segment, run)   # logits [B, T, vocab]

Hook point: the model type's scan functions, rebound once per modeling module (`routing`,
`hooks/<family>` say why there). Each SSM mixer gets a forward pre-hook that tells the
replacements which layer runs and which session its cache belongs to, and a post-hook that
fails loudly if a mixer returned without passing through a replacement (a transformers change
of code path must never turn into a silent FP32 run). Conv states, KV caches, masks, norms and
projections stay Hugging Face's code; its attention too, but for one-token queries with a boolean
mask on CUDA (a static cache's decode step), which read only the columns the mask opens
(`decode_attention`). A cache the model creates itself (generate()) gets a session with the
model's default config.
"""

from __future__ import annotations

import inspect

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import Cache

from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.models import routing
from replayssm_eval.models.decode_attention import use_decode_attention
from replayssm_eval.models.model_types import find_ssm_layers, model_type_of
from replayssm_eval.models.presets import geometry_from_config
from replayssm_eval.models.fixtures import resolve_model
from replayssm_eval.models.hooks import REPLACEMENTS
from replayssm_eval.models.quiet import quiet_logs
from replayssm_eval.models.session import ReplaySession, as_config, session_of

_CACHE_ARGS = ("cache", "past_key_values", "cache_params")  # transformers 5.24, then 5.17 names
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


class ReplayModel:
    """An HF causal LM whose SSM layers run through the ReplaySSM kernels.

    model: the HF model (its own object, hooked in place); tokenizer: its tokenizer or None.
    model_type: the `model_types.ModelType`; layers: {layer_idx: mixer} of every SSM layer.
    config: default ReplayConfig of new sessions; backend: "torch" | "triton" for the kernels.
    """

    def __init__(self, model, tokenizer=None, *, config: ReplayConfig | str = "fp32", backend: str = "torch"):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_type = model_type_of(model.config)
        self.layers = find_ssm_layers(model, self.model_type)
        self.config = as_config(config)
        self.backend = backend
        # per SSM layer: the kernel reference's check against HF's scan, shared by this model's sessions (once a layer)
        self.reference_checks: dict[int, dict[str, float]] = {}
        for name in self.model_type.scans:
            routing.rebind(self.model_type.module, name, REPLACEMENTS[name])
        use_decode_attention(self.model)
        params = inspect.signature(model.forward).parameters
        self._cache_arg = next(name for name in _CACHE_ARGS if name in params)
        self._takes_positions = "position_ids" in params
        self._context_tokens: list = []
        self._handles = []
        for mixer in self.layers.values():
            self._handles.append(mixer.register_forward_pre_hook(self._enter, with_kwargs=True))
            self._handles.append(mixer.register_forward_hook(self._leave, with_kwargs=True, always_call=True))

    def new_session(
        self, config: ReplayConfig | str | None = None, *, seq_ids=None, engine: str = "chunked",
        backend: str | None = None, reference_scan: str = "hf", compute_dtype: torch.dtype = torch.float32,
    ) -> ReplaySession:
        """A fresh run (its own HF cache and SSM states) under `config` (default: the model's).

        seq_ids: [B] document ids keying the SR bits; engine: "chunked" | "reference" (the slow
        step reference) | "step" (one-token calls through the Triton decode step); backend: kernel
        backend (default: the model's); reference_scan: "hf" | "kernels", what runs the FP32 reference's
        multi-token calls (under "kernels" each SSM layer is checked against HF's scan once per model, in its
        first session's first call: `reference_checks`). See `ReplaySession`.
        """
        return ReplaySession(
            self.check_config(self.config if config is None else config), seq_ids=seq_ids, engine=engine,
            backend=self.backend if backend is None else backend, reference_scan=reference_scan,
            reference_checks=self.reference_checks, compute_dtype=compute_dtype, new_cache=self._new_cache,
        )

    def check_config(self, config: ReplayConfig | str) -> ReplayConfig:
        """`config` as a ReplayConfig; ValueError if it asks for what this model's kernel family lacks, or its
        parts name a layer that is not an SSM layer of this model or heads past the layer's."""
        config = as_config(config)
        for part in config.part_configs:
            if part.gdn_fold == "closed" and not self.model_type.kernels.closed_fold:
                raise ValueError(f"config {config.name!r}: #closed is a fold of the delta-rule families and this "
                                 f"{self.model_type.model_type} model is {self.model_type.family}; accepted: the "
                                 "config without #closed")
        layers = sorted(self.layers)
        for part in config.overrides:
            if part.layer not in self.layers:
                raise ValueError(f"config {config.name!r}: layer {part.layer} is not an SSM layer of this "
                                 f"{self.model_type.model_type} model; accepted: {', '.join(map(str, layers))}")
            config.layer_parts(part.layer, self.num_heads)
        return config

    @property
    def num_heads(self) -> int:
        """Heads of each SSM layer (Mamba-2 heads, GDN value heads, KDA heads)."""
        return geometry_from_config(self.model.config).num_heads

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, session: ReplaySession, *, attention_mask=None, logits_to_keep=0):
        """Feed the next tokens [B, T] of the session's documents; returns logits [B, T', vocab].

        attention_mask: [B, T] padding mask of these tokens (1 = real), for a left-padded prompt;
        the session keeps the full mask and the positions from then on.
        """
        batch, length = input_ids.shape
        if session.tokens and attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("padding after the prompt: only the prompt (the first call of a session) may be padded")
        kwargs = {self._cache_arg: session.cache, "use_cache": True, "logits_to_keep": logits_to_keep}
        device = input_ids.device
        if attention_mask is not None or session.attention_mask is not None:
            past = session.attention_mask
            if past is None:
                past = torch.ones(batch, session.tokens, dtype=torch.long, device=device)
            new = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
            session.attention_mask = torch.cat([past.to(device), new.long()], dim=1)  # [B, tokens]
            kwargs["attention_mask"] = session.attention_mask
        if self._takes_positions:
            # given explicitly: some families (bamba in 5.24) restart positions at 0 on every cached call
            if session.attention_mask is None:
                positions = torch.arange(session.tokens, session.tokens + length, device=device).expand(batch, -1)
            else:
                positions = (session.attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -length:]
            kwargs["position_ids"] = positions
        with quiet_logs():
            out = self.model(input_ids=input_ids, **kwargs)
        session.tokens += length
        return out.logits

    def remove(self) -> None:
        """Unhook the mixers and set SDPA back: the model runs Hugging Face's own scans and attention again."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        use_decode_attention(self.model, on=False)

    def _new_cache(self):
        return DynamicCache(config=self.model.config.get_text_config(decoder=True))

    def _enter(self, mixer, args, kwargs):
        cache = next((v for v in (*args, *kwargs.values()) if isinstance(v, Cache)), None)
        session = None
        if cache is not None:
            session = session_of(cache) or ReplaySession(self.config, backend=self.backend, cache=cache)
        layer = routing.ActiveLayer(mixer.layer_idx, mixer, self.model_type.kernels, session, kwargs.get("attention_mask"))
        self._context_tokens.append(routing.enter(layer))

    def _leave(self, mixer, args, kwargs, output):
        layer = routing.leave(self._context_tokens.pop())
        if output is not None and not layer.routed:
            raise RuntimeError(
                f"SSM layer {layer.layer_idx} ({type(mixer).__name__}) ran without reaching a ReplaySSM scan hook; "
                "this transformers version takes another code path (training mode or a fused kernel?)"
            )


def load_model(
    name_or_path: str, *, dtype: torch.dtype | str, device: str | torch.device = "cpu", device_map=None,
    config: ReplayConfig | str = "fp32", backend: str = "torch", **from_pretrained_kwargs,
) -> ReplayModel:
    """Load a checkpoint (a fixture name, a local folder or a hub id) and route its SSM layers.

    dtype: weights and activations (torch dtype or fp32 / bf16 / fp16); the SSM state precision
    is the config's. device_map: passed to from_pretrained (e.g. "auto" to spread a big model
    with accelerate, which may also offload to "cpu" and "disk"); `device` is used only without
    it. Other keywords (offload_folder, max_memory, ...) go to from_pretrained.
    """
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    path = resolve_model(name_or_path)
    with quiet_logs():
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map, **from_pretrained_kwargs)
    if device_map is None:
        model = model.to(device)
    return ReplayModel(model, tokenizer, config=config, backend=backend)

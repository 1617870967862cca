"""Train the tiny fixture models `tiny-nemotron-h`, `tiny-qwen3.5` and `tiny-kimi-linear` on Shakespeare bytes.

All are real Hugging Face classes at toy size, byte-level (vocab 258: 256 bytes + eos + pad):

    tiny-nemotron-h  NemotronHForCausalLM, pattern "M-M-M*M-M-": 5 Mamba-2, 1 attention, 4 MLP
                     layers; hidden 256; Mamba-2 16 heads x 32 head_dim x 64 state, 2 groups
    tiny-qwen3.5     Qwen3_5ForCausalLM (text-only qwen3_5_text), 8 layers, 3 GDN : 1 attention;
                     hidden 256; GDN 4 key heads, 8 value heads, K = V = 32
    tiny-kimi-linear KimiLinearForCausalLM, 8 layers, 3 KDA : 1 MLA, dense MLPs; hidden 256; KDA 4 heads,
                     K = V = 64

Data: every play in --data (default data/shakespeare/: Project Gutenberg texts, sources in its
ATTRIBUTION.txt), one .txt file each; the held-out plays, `replayssm_eval.data.bundled.HELD_OUT_PLAYS`,
are the package's bundled evaluation text and are read from the package.
Each step trains on `batch_size` random windows of `seq_len` bytes (default 16 x 2048), with
bf16 autocast on a GPU, on the models' plain torch paths (no mamba_ssm, causal_conv1d or fla:
the script refuses to run where they are importable). Training stops at --time-budget seconds
or --max-steps, whichever comes first; the learning rate follows whichever is nearer its end.

The SSM heads start with a spread of decay rates so some have long memory: per layer, head h
gets a quantile u_h (stratified, shuffled) and dt = exp(lerp(log 2e-4, log 0.1, u_h)),
A = exp(lerp(log 1, log 16, u_h)), i.e. dt_bias = softplus^-1(dt), A_log = log A; the static
per-token decay exp(-A dt) then runs from about 0.9998 to 0.2. KDA's decay is per channel,
exp(-A_h softplus(f + dt_bias[h, c])) with f from the forget gate's low-rank projection: every
channel of head h starts at head h's dt. The decay tables list KDA per (head, channel). Nemotron-H's time_step_min
(the lower clamp on dt in its forward) is 1e-4, so the slowest heads are not pinned at the clamp.

Long-memory heads (--long-heads F, default 0): trained freely, GDN heads learn to forget within a few
hundred tokens (a 2048-byte training window rewards nothing longer), so a shared low-precision
checkpoint cannot build up error there, unlike in real GDN models (docs/semantics.md, The paper's results: Qwen3.5-4B's
shared NVFP4 KL grows 36x above split precision at 128K). The first round(F * heads) heads of every
SSM layer then get a fixed, input-independent decay, log-spaced in 1 - decay over
[--long-decay-min, --long-decay-max]: A = 1, dt_bias = softplus^-1(-log decay), and the decay input
rows (GDN `in_proj_a`, Mamba-2 the dt rows of `in_proj`, KDA the head's channel rows of the forget gate's
`f_b_proj`) zero; gradient hooks keep all three fixed. KDA's long heads get one decay per channel,
log-spaced over all their channels together.
The delta rule also forgets: each token contracts the state along its key by beta. --beta-penalty
adds that weight times the long heads' mean beta (GDN, KDA) to the loss, so they learn to write gently.

Outputs, per model, in --out/<name>/: config.json, model.safetensors (bf16), the byte-level
tokenizer files, and training.json (command, steps, wall time, held-out bits per byte computed
in fp32 from the stored bf16 weights, and the per-head decay table: static decay and the mean
per-token decay measured on held-out text).

Run from the repository root (the package importable: `pip install -e .` or PYTHONPATH=.):

    PYTHONUNBUFFERED=1 python scripts/train_tiny.py --model tiny-nemotron-h --out out/fixtures --time-budget 240
    # CPU smoke test:
    python scripts/train_tiny.py --model tiny-qwen3.5 --out out/fx --max-steps 3 --seq-len 256 --batch-size 2 \
        --eval-bytes 1024
"""

import argparse
import dataclasses
import datetime
import hashlib
import importlib.util
import json
import math
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import (
    NemotronHConfig,
    NemotronHForCausalLM,
    PretrainedConfig,
    KimiLinearConfig,
    KimiLinearForCausalLM,
    PreTrainedModel,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
)

from replayssm_eval.data.bundled import HELD_OUT_PLAYS, bundled_text_paths, load_bundled_text
from replayssm_eval.models.tokenizer import EOS_TOKEN_ID, PAD_TOKEN_ID, VOCAB_SIZE, save_byte_tokenizer

DT_INIT_RANGE = (2e-4, 0.1)
A_INIT_RANGE = (1.0, 16.0)
CHECK_BYTES = 2048  # tests/models/test_fixtures.py recomputes bits/byte on this many bundled bytes
KERNEL_PACKAGES = ("mamba_ssm", "causal_conv1d", "fla")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What every training run of the fixtures sets (this script's and train_solvers.py's); a run's command line is
    generated from its config's fields."""

    model: str
    out: str  # the model is written to out/<model>/
    time_budget: float = 240.0  # seconds of training, evaluation not included
    max_steps: int = 1_000_000
    seq_len: int = 2048
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    log_every: int = 25
    long_heads: float = 0.0  # share of each SSM layer's heads with a fixed slow decay (see the docstring)
    long_decay_min: float = 0.999
    long_decay_max: float = 0.9999
    beta_penalty: float = 0.0  # GDN, KDA: loss weight of the long heads' mean beta


@dataclasses.dataclass(frozen=True)
class TrainConfig(RunConfig):
    """One training run on the plays."""

    model: str  # tiny-nemotron-h | tiny-qwen3.5 | tiny-kimi-linear
    data: str = "data/shakespeare"  # folder of training plays, one .txt each (relative to the working directory)
    eval_bytes: int = 0  # held-out bytes per play to evaluate; 0 = whole plays


def nemotron_h_config() -> NemotronHConfig:
    """tiny-nemotron-h: 3.72M parameters, 7.4 MB in bf16."""
    return NemotronHConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        hybrid_override_pattern="M-M-M*M-M-",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=512,
        mlp_hidden_act="relu2",
        mamba_num_heads=16,
        mamba_head_dim=32,
        ssm_state_size=64,
        n_groups=2,
        conv_kernel=4,
        chunk_size=128,
        time_step_min=1e-4,
        time_step_max=0.1,
        time_step_floor=1e-4,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=EOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )


def qwen3_5_config() -> Qwen3_5TextConfig:
    """tiny-qwen3.5: 3.84M parameters, 7.7 MB in bf16."""
    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * 2
    return Qwen3_5TextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=len(layer_types),
        layer_types=layer_types,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=EOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )


def kimi_linear_config() -> KimiLinearConfig:
    """tiny-kimi-linear: 3.94M parameters, 7.9 MB in bf16."""
    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * 2
    return KimiLinearConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=len(layer_types),
        layer_types=layer_types,
        mlp_layer_types=["dense"] * len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=64,
        q_lora_rank=None,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        linear_num_heads=4,
        linear_head_dim=64,
        linear_conv_kernel_dim=4,
        model_max_length=8192,
        tie_word_embeddings=False,
        bos_token_id=EOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )


MODELS: dict[str, tuple[Callable[[], PretrainedConfig], type[PreTrainedModel]]] = {
    "tiny-nemotron-h": (nemotron_h_config, NemotronHForCausalLM),
    "tiny-qwen3.5": (qwen3_5_config, Qwen3_5ForCausalLM),
    "tiny-kimi-linear": (kimi_linear_config, KimiLinearForCausalLM),
}


def config_parser(config_cls: type, description: str) -> argparse.ArgumentParser:
    """A parser with one --flag per field of the dataclass `config_cls` (its default and type)."""
    parser = argparse.ArgumentParser(description=description)
    for field in dataclasses.fields(config_cls):
        flag = "--" + field.name.replace("_", "-")
        if field.default is dataclasses.MISSING:
            parser.add_argument(flag, required=True, type=field.type)
        else:
            parser.add_argument(flag, type=type(field.default), default=field.default)
    return parser


def parse_config(config_cls: type, models, description: str):
    """`config_cls` from the command line (`config_parser`), its model one of `models` and its long-head options checked."""
    parser = config_parser(config_cls, description)
    cfg = config_cls(**vars(parser.parse_args()))
    if cfg.model not in models:
        parser.error(f"unknown model {cfg.model!r}; known: {', '.join(models)}")
    if not 0.0 <= cfg.long_heads <= 1.0:
        parser.error(f"--long-heads {cfg.long_heads}: expected a share of the heads in [0, 1]")
    if not 0.0 < cfg.long_decay_min <= cfg.long_decay_max < 1.0:
        parser.error(f"--long-decay-min {cfg.long_decay_min} / --long-decay-max {cfg.long_decay_max}: "
                     "expected 0 < min <= max < 1")
    return cfg


def parse_args() -> TrainConfig:
    return parse_config(TrainConfig, MODELS, __doc__.split("\n\n")[0])


# ---- data


def load_plays(data_dir: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(training plays, held-out plays), each {file stem: bytes}.

    Training: every .txt in `data_dir` (but ATTRIBUTION.txt and any held-out play), in name order.
    Held out: the package's bundled plays (`HELD_OUT_PLAYS`, `replayssm_eval/data/text/`).
    """
    skip = {"ATTRIBUTION", "metadata", *HELD_OUT_PLAYS}
    plays = {p.stem: p.read_bytes() for p in sorted(data_dir.glob("*.txt")) if p.stem not in skip}
    if not plays:
        raise FileNotFoundError(f"no training plays (*.txt) in {str(data_dir)!r}; expected e.g. data/shakespeare")
    held_out = {path.stem: path.read_bytes() for path in bundled_text_paths()}
    return plays, held_out


def byte_ids(data: bytes) -> torch.Tensor:
    """Token ids of raw bytes: the byte values. [N] int64"""
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).astype(np.int64))


def training_stream(plays: dict[str, bytes]) -> torch.Tensor:
    """All training plays as one id stream, each play followed by eos. [N] int64"""
    parts = []
    for data in plays.values():
        parts += [byte_ids(data), torch.tensor([EOS_TOKEN_ID])]
    return torch.cat(parts)


# ---- model


def log_lerp(lo: float, hi: float, u: torch.Tensor) -> torch.Tensor:
    """exp(lerp(log lo, log hi, u)): log-spaced from lo (u = 0) to hi (u = 1)."""
    return torch.exp(math.log(lo) + u * math.log(hi / lo))


def inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    """softplus^-1(x) = log(exp(x) - 1), for x > 0."""
    return x + torch.log(-torch.expm1(-x))


@torch.no_grad()
def init_slow_heads(model: PreTrainedModel, generator: torch.Generator) -> None:
    """Spread each SSM layer's heads from slow (decay ~0.9998) to fast; see the file docstring."""
    for mixer in ssm_mixers(model):
        module, heads, per = decay_params(mixer)
        u = (torch.randperm(heads, generator=generator) + torch.rand(heads, generator=generator)) / heads
        dt = log_lerp(*DT_INIT_RANGE, u)
        a = log_lerp(*A_INIT_RANGE, u)
        module.dt_bias.copy_(inverse_softplus(dt).repeat_interleave(per).view_as(module.dt_bias))
        module.A_log.copy_(torch.log(a).view_as(module.A_log))


def decay_params(mixer: torch.nn.Module) -> tuple[torch.nn.Module, int, int]:
    """(module holding A_log and dt_bias, heads, decay channels per head): 1 for Mamba-2 and GDN, K for KDA
    (its forget gate holds A_log [1, 1, H, 1] and dt_bias [H * K])."""
    module = getattr(mixer, "forget_gate", mixer)
    heads = module.A_log.numel()
    return module, heads, module.dt_bias.numel() // heads


def decay_input(mixer: torch.nn.Module) -> tuple[torch.Tensor, int]:
    """(weight, first row) of the projection rows that feed the decay: GDN `in_proj_a` [H, hidden],
    KDA the forget gate's `f_b_proj` [H * K, rank], Mamba-2 the last H rows of `in_proj` (its output is
    [z, xBC, dt])."""
    if hasattr(mixer, "in_proj_a"):
        return mixer.in_proj_a.weight, 0
    if hasattr(mixer, "forget_gate"):
        return mixer.forget_gate.f_b_proj.weight, 0
    if mixer.in_proj.bias is not None:
        raise ValueError("long-memory heads need an in_proj without bias (its dt entries would move the decay)")
    return mixer.in_proj.weight, mixer.in_proj.weight.shape[0] - mixer.A_log.numel()


def _freeze(param: torch.Tensor, mask: torch.Tensor) -> None:
    """Zero the gradient where mask is set (AdamW then leaves those entries, weight decay included for zeros)."""
    param.register_hook(lambda grad: grad.masked_fill(mask.to(grad.device), 0.0))


@torch.no_grad()
def init_long_heads(model: PreTrainedModel, cfg: TrainConfig) -> list[list[int]]:
    """Fix the decay of the first round(long_heads * H) heads of every SSM layer (see the file docstring);
    returns their indices per layer."""
    chosen = []
    for mixer in ssm_mixers(model):
        module, heads, per = decay_params(mixer)
        n = round(cfg.long_heads * heads)
        chosen.append(list(range(n)))
        if n == 0:
            continue
        u = torch.linspace(0.0, 1.0, n * per, dtype=torch.float64)  # log-spaced 1 - decay, slowest first
        dt = -torch.log1p(-log_lerp(1 - cfg.long_decay_max, 1 - cfg.long_decay_min, u))  # -log(decay)
        module.A_log.view(-1)[:n] = 0.0  # A = 1: decay = exp(-softplus(dt_bias))
        module.dt_bias.view(-1)[:n * per] = inverse_softplus(dt).float()
        weight, first = decay_input(mixer)
        weight[first:first + n * per] = 0.0
        rows = torch.zeros(weight.shape[0], 1, dtype=torch.bool)
        rows[first:first + n * per] = True
        _freeze(weight, rows.expand_as(weight))
        _freeze(module.A_log, (torch.arange(heads) < n).view_as(module.A_log))
        _freeze(module.dt_bias, (torch.arange(heads * per) < n * per).view_as(module.dt_bias))
    return chosen


def beta_projection(mixer: torch.nn.Module) -> torch.nn.Module | None:
    """The projection whose sigmoid is beta: GDN `in_proj_b`, KDA `b_proj`; None for Mamba-2."""
    return getattr(mixer, "in_proj_b", None) or getattr(mixer, "b_proj", None)


class BetaPenalty:
    """Mean write strength beta = sigmoid(in_proj_b(x)) of each GDN or KDA layer's long heads in the last forward."""

    def __init__(self, model: torch.nn.Module, long_heads: list[list[int]]):
        self.values: list[torch.Tensor] = []
        self.handles = [beta_projection(mixer).register_forward_hook(self._hook(heads))
                        for mixer, heads in zip(ssm_mixers(model), long_heads)
                        if heads and beta_projection(mixer) is not None]

    def _hook(self, heads: list[int]):
        def hook(_module, _inputs, output):
            self.values.append(output[..., heads].float().sigmoid().mean())
        return hook

    def pop(self) -> torch.Tensor | None:
        """The mean over layers since the last call, or None when no layer has long GDN or KDA heads."""
        values, self.values = self.values, []
        return torch.stack(values).mean() if values else None


def ssm_mixers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The Mamba-2 mixers (have `in_proj`), GDN layers (have `in_proj_a`) or KDA layers (A_log and dt_bias on
    their `forget_gate`), in layer order."""
    has_decay = lambda m: hasattr(m, "A_log") and hasattr(m, "dt_bias")  # noqa: E731
    mixers = [m for m in model.modules() if has_decay(m) or has_decay(getattr(m, "forget_gate", None))]
    gates = {id(m.forget_gate) for m in mixers if hasattr(m, "forget_gate")}
    mixers = [m for m in mixers if id(m) not in gates]
    if not mixers:
        raise ValueError(f"no SSM layers (modules with A_log and dt_bias) in {type(model).__name__}")
    return mixers


def _rates(mixer: torch.nn.Module) -> torch.Tensor:
    """exp(A_log) per decay channel: [H] (Mamba-2, GDN) or [H * K] (KDA)."""
    module, _, per = decay_params(mixer)
    return torch.exp(module.A_log.float().reshape(-1)).repeat_interleave(per)


def static_decay(mixer: torch.nn.Module) -> torch.Tensor:
    """Per-channel decay for a zero dt input: exp(-exp(A_log) softplus(dt_bias)). [H] or, KDA, [H * K]

    Mamba-2 clamps dt below at time_step_min (`time_step_limit`); the clamp is applied here too.
    """
    module = decay_params(mixer)[0]
    dt = F.softplus(module.dt_bias.float().reshape(-1))
    if hasattr(module, "time_step_limit"):
        dt = dt.clamp(*module.time_step_limit)
    return torch.exp(-_rates(mixer) * dt)


class DecayMeter:
    """Mean over tokens of each head's actual per-token decay, from forward hooks.

    Mamba-2: dt is the last `num_heads` columns of `in_proj`'s output, decay exp(-A softplus(dt +
    dt_bias)) with dt clamped as in the forward. GDN: decay exp(-A softplus(a + dt_bias)), a the
    output of `in_proj_a`. KDA: the same per channel, from the forget gate's `f_b_proj` output.
    """

    def __init__(self, model: torch.nn.Module):
        self.mixers = ssm_mixers(model)
        self.sums = [torch.zeros(_rates(m).numel(), dtype=torch.float64) for m in self.mixers]
        self.tokens = [0] * len(self.mixers)
        self.handles = []
        for i, mixer in enumerate(self.mixers):
            if hasattr(mixer, "forget_gate"):
                proj = mixer.forget_gate.f_b_proj
            else:
                proj = mixer.in_proj_a if hasattr(mixer, "in_proj_a") else mixer.in_proj
            self.handles.append(proj.register_forward_hook(self._hook(i)))

    def _hook(self, index: int):
        mixer = self.mixers[index]
        module = decay_params(mixer)[0]
        rates = _rates(mixer)
        channels = rates.numel()

        def hook(_module, _inputs, output):
            raw = output[..., -channels:].float().reshape(-1, channels)  # [tokens, H] or [tokens, H * K]
            dt = F.softplus(raw + module.dt_bias.float().reshape(-1))
            if hasattr(module, "time_step_limit"):
                dt = dt.clamp(*module.time_step_limit)
            decay = torch.exp(-rates.to(dt.device) * dt)
            self.sums[index] += decay.sum(0).double().cpu()
            self.tokens[index] += raw.shape[0]

        return hook

    def means(self) -> list[list[float]]:
        """Per layer, per head mean decay."""
        return [(s / max(n, 1)).tolist() for s, n in zip(self.sums, self.tokens)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def decay_table(per_layer: list[list[float]]) -> dict:
    """Counts above 0.99 / 0.999 and quantiles of a per-layer, per-head (KDA: per head and channel) decay list."""
    flat = torch.tensor([d for layer in per_layer for d in layer], dtype=torch.float64)
    return {
        "heads": flat.numel(),
        "above_0.99": int((flat > 0.99).sum()),
        "above_0.999": int((flat > 0.999).sum()),
        "median": float(flat.median()),
        "max": float(flat.max()),
        "min": float(flat.min()),
        "per_layer": [[round(d, 6) for d in layer] for layer in per_layer],
    }


# ---- train and evaluate


def lr_at(cfg: TrainConfig, step: int, elapsed: float) -> float:
    """Linear warmup, then cosine to min_lr_ratio over whichever limit (steps, time) is nearer."""
    progress = min(1.0, max(step / cfg.max_steps, elapsed / cfg.time_budget))
    cosine = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) * cosine


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; no weight decay on vectors (A_log, dt_bias, D, norms, biases)."""
    vector = lambda name, p: p.ndim < 2 or name.endswith("A_log")  # noqa: E731  KDA's A_log is [1, 1, H, 1]
    decay = [p for name, p in model.named_parameters() if not vector(name, p)]
    no_decay = [p for name, p in model.named_parameters() if vector(name, p)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=cfg.device.startswith("cuda"))


def optimizer_step(model: torch.nn.Module, optimizer, loss: torch.Tensor, penalty: BetaPenalty, cfg: RunConfig):
    """One update on `loss` plus the long heads' beta penalty (gradients clipped); returns that mean beta or None."""
    beta = penalty.pop()
    objective = loss if beta is None else loss + cfg.beta_penalty * beta
    optimizer.zero_grad(set_to_none=True)
    objective.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    return beta


def train(model: PreTrainedModel, stream: torch.Tensor, cfg: TrainConfig, long_heads: list[list[int]]) -> dict:
    """Train in place until the time budget or max_steps; returns step count, wall time, train bits/byte and the
    long heads' mean beta."""
    device = torch.device(cfg.device)
    stream = stream.to(device)
    optimizer = make_optimizer(model, cfg)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    window = torch.arange(cfg.seq_len + 1, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    penalty = BetaPenalty(model, long_heads)
    beta = None
    model.train()

    step, ema_loss, start = 0, None, time.perf_counter()
    last_log_time, last_log_step = start, 0
    while step < cfg.max_steps and time.perf_counter() - start < cfg.time_budget:
        lr = lr_at(cfg, step, time.perf_counter() - start)
        for group in optimizer.param_groups:
            group["lr"] = lr
        offsets = torch.randint(0, stream.numel() - cfg.seq_len - 1, (cfg.batch_size, 1), device=device, generator=generator)
        batch = stream[offsets + window]  # [B, L+1]
        with autocast:
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits  # [B, L, V]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        beta = optimizer_step(model, optimizer, loss, penalty, cfg)
        step += 1

        if step % cfg.log_every == 0 or step == cfg.max_steps:
            value = loss.item()  # syncs, so the timing below is real
            ema_loss = value if ema_loss is None else 0.9 * ema_loss + 0.1 * value
            now = time.perf_counter()
            ms = 1000 * (now - last_log_time) / (step - last_log_step)
            print(
                f"[{cfg.model}] step {step:5d}  loss {value:.4f}  bpb {value / math.log(2):.3f}  lr {lr:.2e}  "
                f"{ms:.0f} ms/step  {cfg.batch_size * cfg.seq_len / ms * 1e3:,.0f} tok/s  {now - start:.0f} s"
                + ("" if beta is None else f"  long-head beta {beta.item():.3f}")
            )
            last_log_time, last_log_step = now, step
    wall = time.perf_counter() - start
    if ema_loss is None and step:  # the time budget ended before the first log step
        ema_loss = loss.item()
    bpb = None if ema_loss is None else round(ema_loss / math.log(2), 4)
    return {"steps": step, "train_seconds": round(wall, 1), "train_bits_per_byte_ema": bpb,
            "long_heads": long_heads, "long_head_beta_last": None if beta is None else round(beta.item(), 4)}


@torch.no_grad()
def bits_per_byte(model: PreTrainedModel, ids: torch.Tensor, seq_len: int, batch_size: int) -> float:
    """Mean next-byte cross-entropy in bits over non-overlapping windows of `ids` ([N] int64).

    Each window starts without context; its first byte is not predicted.
    """
    device = next(model.parameters()).device
    windows = list(ids.split(seq_len))
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        group = windows[i : i + batch_size]
        for length in sorted({w.numel() for w in group}):  # a short last window goes alone
            batch = torch.stack([w for w in group if w.numel() == length]).to(device)  # [b, length]
            if length < 2:
                continue
            logits = model(input_ids=batch, use_cache=False).logits.float()  # [b, length, V]
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
            total += loss.item()
            count += batch[:, 1:].numel()
    return total / count / math.log(2)


def evaluate(model: PreTrainedModel, held_out: dict[str, bytes], cfg: TrainConfig) -> dict:
    """Held-out bits/byte (fp32 compute) per play and overall, the check value, and the decay tables."""
    model.eval()
    meter = DecayMeter(model)
    per_play, total_bits, total_bytes = {}, 0.0, 0
    for stem, data in held_out.items():
        ids = byte_ids(data[: cfg.eval_bytes or None])
        bpb = bits_per_byte(model, ids, cfg.seq_len, cfg.batch_size)
        per_play[stem] = round(bpb, 4)
        predicted = ids.numel() - math.ceil(ids.numel() / cfg.seq_len)
        total_bits, total_bytes = total_bits + bpb * predicted, total_bytes + predicted
    meter.remove()
    check_ids = byte_ids(load_bundled_text().encode("utf-8")[:CHECK_BYTES])
    return {
        "held_out_bits_per_byte": round(total_bits / total_bytes, 4),
        "held_out_bits_per_byte_per_play": per_play,
        "held_out_bytes": total_bytes,
        "check_bytes": CHECK_BYTES,
        "check_bits_per_byte": round(bits_per_byte(model, check_ids, CHECK_BYTES, 1), 5),
        "decay_static": decay_table([static_decay(m).tolist() for m in ssm_mixers(model)]),
        "decay_measured_held_out": decay_table(meter.means()),
    }


# ---- provenance and output


def git_rev() -> str | None:
    """HEAD of the repository the script is in, or None (no git, or no commits yet)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def provenance(device: str, script: Path) -> dict:
    """Date, git revision, the training script's sha256, versions and device of a training record."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_rev": git_rev(),
        "script_sha256": hashlib.sha256(script.read_bytes()).hexdigest(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]},
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
    }


def check_torch_paths(allowed: tuple[str, ...] = ()) -> None:
    """Refuse to train where transformers would bind kernel packages (but `allowed`) instead of its torch paths."""
    present = [name for name in KERNEL_PACKAGES if name not in allowed and importlib.util.find_spec(name) is not None]
    if present:
        raise RuntimeError(f"kernel packages {present} are importable; the fixtures train on the plain torch paths only")


def save(model: PreTrainedModel, out_dir: Path, record: dict) -> None:
    """config.json, model.safetensors (bf16), tokenizer files and training.json into out_dir."""
    model.to(torch.bfloat16).save_pretrained(out_dir)
    (out_dir / "generation_config.json").unlink(missing_ok=True)
    save_byte_tokenizer(out_dir)
    record["model_safetensors_bytes"] = (out_dir / "model.safetensors").stat().st_size
    (out_dir / "training.json").write_text(json.dumps(record, indent=2) + "\n")


def main() -> None:
    cfg = parse_args()
    check_torch_paths()
    torch.manual_seed(cfg.seed)
    train_plays, held_out = load_plays(Path(cfg.data))
    stream = training_stream(train_plays)

    config_fn, model_cls = MODELS[cfg.model]
    model = model_cls(config_fn())
    init_slow_heads(model, torch.Generator().manual_seed(cfg.seed))
    long_heads = init_long_heads(model, cfg)
    decay_init = decay_table([static_decay(m).tolist() for m in ssm_mixers(model)])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[{cfg.model}] {n_params:,} parameters; {stream.numel():,} training bytes from {len(train_plays)} plays; "
          f"init decay: {decay_init['above_0.99']}/{decay_init['heads']} heads > 0.99, {decay_init['above_0.999']} > 0.999")

    model.to(cfg.device)
    result = train(model, stream, cfg, long_heads)
    model.to(torch.bfloat16).float()  # evaluate exactly the weights that are stored (bf16)
    start = time.perf_counter()
    result |= evaluate(model, held_out, cfg)
    print(f"[{cfg.model}] held-out {result['held_out_bits_per_byte']:.4f} bits/byte {result['held_out_bits_per_byte_per_play']} "
          f"(eval {time.perf_counter() - start:.0f} s); static decay > 0.99: {result['decay_static']['above_0.99']}, "
          f"> 0.999: {result['decay_static']['above_0.999']} of {result['decay_static']['heads']}")

    record = {
        "model": cfg.model,
        "model_class": model_cls.__name__,
        "parameters": n_params,
        "stored_dtype": "bfloat16",
        "command": "python " + shlex.join(sys.argv),
        "train_config": dataclasses.asdict(cfg),
        "tokens_per_step": cfg.batch_size * cfg.seq_len,
        **result,
        "decay_init": decay_init,
        "train_plays": sorted(train_plays),
        "held_out_plays": list(held_out),
        "init": {"dt_range": DT_INIT_RANGE, "A_range": A_INIT_RANGE, "scheme": "stratified log-uniform, paired"},
        **provenance(cfg.device, Path(__file__)),
    }
    out_dir = Path(cfg.out) / cfg.model
    save(model, out_dir, record)
    print(f"[{cfg.model}] wrote {out_dir}: model.safetensors {record['model_safetensors_bytes']:,} bytes")


if __name__ == "__main__":
    main()

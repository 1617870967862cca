"""A fake model for the KL driver's tests: the `kl.runner` protocol without replayssm_eval.models.

FakeRunner is a diagonal linear recurrence over byte tokens, h_t = a * h_{t-1} + E[x_t], with
logits W h_t. A stream in a non-reference config rounds its carried state to bf16 at every flush
(window position L-1) and at the end of the prefill, so its KL is > 0 and grows along the
document, while the `fp32` config runs exactly the reference's operations (KL exactly 0).
Stochastic-rounding-like noise keyed by (config seed, sequence id) makes results depend on the
sequence id as the real models' SR bits do. The hidden channels stand for SSM layers FAKE_LAYERS of
FAKE_HEADS heads (HIDDEN / layers / heads channels per head), so a mixed config rounds only the
channels of the layers and heads whose part is not FP32 (`ssm_layout` gives that layout). `install(fail_after=N, fault=f)` calls `f()` at the
start of the N+1-th `extend` call: by default it raises KeyboardInterrupt (an interrupt the driver
did not defer); `ctrl_c()` sends SIGINT, as a terminal's Ctrl-C does; `crash` raises RuntimeError.
"""

from __future__ import annotations

import json
import os
import signal
import socket

import torch

from replayssm_eval.formats import get_format
from replayssm_eval.kl import runner as runner_module
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.models.tokenizer import VOCAB_SIZE, build_byte_tokenizer

FAKE_MODEL = "fake-byte-lm"
RESULT_KEYS = ("reference", "configs", "documents", "tokens", "prompt_len", "document_indices")  # what a resume must equal
HIDDEN = 24
FAKE_LAYERS, FAKE_HEADS = (0, 2, 4), 4  # 2 channels per head


class FakeRunner:
    device = torch.device("cpu")

    def __init__(self, fail_after: int | None = None, fault=None):
        gen = torch.Generator().manual_seed(0)
        self.embed = torch.randn(VOCAB_SIZE, HIDDEN, generator=gen)  # [V, H]
        self.decay = 0.9 + 0.099 * torch.rand(HIDDEN, generator=gen)  # [H]
        self.out = torch.randn(HIDDEN, VOCAB_SIZE, generator=gen) * 0.5  # [H, V]
        self.fail_after, self.fault = fail_after, fault or raise_keyboard_interrupt
        self.extends = 0
        self.opened = []
        self.on_layer = None
        self.reference_checks = {}  # the fake's reference runs no scan to check

    def check(self, config):
        """Every config runs on the fake model."""

    def open(self, config, seq_ids):
        stream = FakeStream(self, config, seq_ids)
        self.opened.append(stream)
        return stream

    def restore(self, config, seq_ids, saved):
        stream = self.open(config, seq_ids)
        stream.h, stream.steps = saved["h"], saved["steps"]
        return stream

    def state_traffic(self, config):
        """Per layer: the bytes of both copies of a [4, 2, 16] state in its layer's formats, each head part
        counting its heads' share; the fields `kl.sensitivity`'s budget reads (a layer with head parts lists
        them, as `models.traffic` does)."""
        fp32 = fake_layer_bytes(ReplayConfig())
        per_layer = {}
        for layer in FAKE_LAYERS:
            parts = [{"config": c.name, "heads": list(heads), "replay": {"total": fake_layer_bytes(c, len(heads))},
                      "conventional_fp32": fake_layer_bytes(ReplayConfig(), len(heads))}
                     for c, heads in config.layer_parts(layer, FAKE_HEADS)]
            per_layer[str(layer)] = {"replay": {"total": sum(p["replay"]["total"] for p in parts)},
                                     **({"parts": parts} if len(parts) > 1 else {})}
        total = sum(t["replay"]["total"] for t in per_layer.values())
        return {"replay": {"total": total / len(FAKE_LAYERS)}, "conventional_fp32": fp32, "per_layer": per_layer,
                "per_model": {"replay": total, "conventional_fp32": fp32 * len(FAKE_LAYERS)}}

    def skip_reads(self, config):
        return None if config.skip_read_below is None else {"total": {"skipped": 0}}


class FakeStream:
    def __init__(self, runner: FakeRunner, config, seq_ids: torch.Tensor):
        self.runner, self.config = runner, config
        self.h = torch.zeros(len(seq_ids), HIDDEN)  # [B, H]
        self.steps = 0
        self.closed = False
        self.noise = 1e-3 * torch.stack([  # [B, H]: per-sequence perturbation of the stored state
            torch.randn(HIDDEN, generator=torch.Generator().manual_seed(config.seed * 7919 + int(s))) for s in seq_ids
        ])

    def _store(self, h):
        if self.config.is_reference:
            return h
        rounded = (h + self.noise * h.abs()).to(torch.bfloat16).float()
        return torch.where(rounding_mask(self.config), rounded, h)

    def prefill(self, tokens):
        for t in range(tokens.shape[1]):
            self.h = self.runner.decay * self.h + self.runner.embed[tokens[:, t]]
        logits = self.h[:, None] @ self.runner.out  # [B, 1, V]
        self.h = self._store(self.h)
        return logits

    def extend(self, tokens):
        self.runner.extends += 1
        if self.runner.fail_after is not None and self.runner.extends == self.runner.fail_after + 1:
            self.runner.fault()
        states = []
        for t in range(tokens.shape[1]):
            self.h = self.runner.decay * self.h + self.runner.embed[tokens[:, t]]
            states.append(self.h)
            if self.steps % self.config.window == self.config.window - 1:
                self.h = self._store(self.h)
            self.steps += 1
            if self.runner.on_layer is not None:  # a real model reports per layer; the fake per token
                self.runner.on_layer((t + 1) / tokens.shape[1])
        return torch.stack(states, dim=1) @ self.runner.out  # [B, S, V]

    def save(self):
        return {"h": self.h, "steps": self.steps}

    def close(self):
        self.closed = True


def fake_layer_bytes(config, heads: int = FAKE_HEADS) -> int:
    """The fake's traffic of `heads` heads of one layer in `config`: both copies of a [heads, 2, 16] state."""
    return sum(get_format(name).storage_bytes((heads, 2, 16)) for name in (config.read, config.recur))


def rounding_mask(config) -> torch.Tensor:
    """[HIDDEN] bool: the channels whose layer and head run a config that is not FP32."""
    width = HIDDEN // len(FAKE_LAYERS) // FAKE_HEADS
    mask = torch.zeros(len(FAKE_LAYERS), FAKE_HEADS, width, dtype=torch.bool)
    for i, layer in enumerate(FAKE_LAYERS):
        for part, heads in config.layer_parts(layer, FAKE_HEADS):
            mask[i, list(heads)] = not part.is_reference
    return mask.flatten()


def ssm_layout(model: str) -> tuple[list[int], int]:
    load_tokenizer(model)
    return list(FAKE_LAYERS), FAKE_HEADS


def raise_keyboard_interrupt():
    raise KeyboardInterrupt


def crash():
    raise RuntimeError("simulated crash")


def ctrl_c(times: int = 1):
    """A fault that sends SIGINT to the calling thread `times` times.

    `raise_signal` directs the signal at this (the main) thread, which runs its C handler before the
    call returns, so the driver's Python handler runs at the next bytecode, within the current segment.
    `os.kill(os.getpid(), ...)` would direct it at the process, and the kernel may hand a process-directed
    signal to any thread that does not block it (tqdm's monitor, torch's or gloo's threads): on a loaded
    machine that thread may run its C handler only after the main thread has passed the segment boundary,
    and the snapshot then lands a segment later.
    """

    def send():
        for _ in range(times):
            signal.raise_signal(signal.SIGINT)

    return send


def load_tokenizer(model: str):
    if model != FAKE_MODEL:
        raise ValueError(f"unknown model {model!r}; the fake knows only {FAKE_MODEL!r}")
    return build_byte_tokenizer()


def install(fail_after: int | None = None, fault=None, setattr=setattr) -> list[FakeRunner]:
    """Point kl.runner at the fake (pass `monkeypatch.setattr` to undo it after a test).

    Returns the list that collects the runners created.
    """
    created: list[FakeRunner] = []

    def load_runner(model, *, device, dtype, backend, device_map, reference_scan):
        load_tokenizer(model)
        created.append(FakeRunner(fail_after, fault))
        return created[-1]

    setattr(runner_module, "load_tokenizer", load_tokenizer)
    setattr(runner_module, "load_runner", load_runner)
    setattr(runner_module, "ssm_layout", ssm_layout)
    return created


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank: int, world: int, port: int, options, fail_after: int | None = None, fault=None) -> None:
    """One process of a `world`-process run on gloo (the target of torch.multiprocessing.spawn).

    A KeyboardInterrupt ends the process normally, as the CLI does (exit code 130 there).
    """
    import torch.distributed as dist

    from replayssm_eval.kl.driver import run_kl

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    install(fail_after, fault)
    try:
        run_kl(options)
    except KeyboardInterrupt:
        pass
    finally:
        dist.destroy_process_group()


def kl_results(run_dir) -> dict:
    """The RESULT_KEYS of a run's kl.json: the numbers an interrupted and resumed run must reproduce."""
    report = json.loads((run_dir / "kl.json").read_text())
    return {k: report[k] for k in RESULT_KEYS}

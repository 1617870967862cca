"""Train the scoring fixtures on the synthetic tasks: models that answer questions, so accuracy gaps are real.

    tiny-nemotron-h-solver   the tiny-nemotron-h architecture (Mamba-2)
    tiny-qwen3.5-solver      the tiny-qwen3.5 architecture (GDN)
    tiny-kimi-linear-solver  the tiny-kimi-linear architecture (KDA)

Architectures, SSM head initialisation and long-memory heads are those of `scripts/train_tiny.py`
(its docstring says how); only the data differs. Each row of a batch packs whole examples of
`synth_sum` and `synth_swap` (`replayssm_eval.accuracy.synthetic`, training split, half each), every
example written `prompt + target + eos` exactly as the lm-eval tasks show the prompt, and the
loss counts only the target and eos bytes. Examples never straddle rows; the rest of a row is
padding, which no loss counts. A row is `--seq-len` bytes, which holds the longest example of
both tasks whole, so long generations are trained at their real positions. Data comes from
`--workers` DataLoader processes, each drawing its own training seeds.

Training stops at --time-budget seconds or --max-steps; --init-from continues from a solver trained before
(a new --seed draws new examples). Then the stored (bf16) weights are scored
on the first --eval-questions test questions of each task, greedy through the package's engine
(FP32 state, Triton decode step on a GPU), with the tasks' own answer rules (the last boxed
answer; "answer is (X)"): training.json records the command, time, the loss curve, this held-out
accuracy overall and in the longest quarter of gold lengths, and the decay tables.

Every run trains on transformers' plain torch paths, but `--scan-kernels fla` trains KDA with fla's Triton
`chunk_kda` (transformers' torch chunk rule runs 3 s a step at 4 x 5,120 tokens on an H200), one config per
kernel (autotuning them all compiled for over 6 minutes): it is checked against the torch rule first (outputs
and gradients, strong decays included) and recorded in training.json. The stored weights are the same kind
either way; evaluation never uses fla. GDN stays on the torch rule: fla 0.6.0 refuses GDN's gated backward on
Hopper with Triton < 3.7.1, where it gives wrong results.

Run from the repository root (the package importable):

    PYTHONUNBUFFERED=1 python scripts/train_solvers.py --model tiny-qwen3.5-solver --out out/solvers --time-budget 420
    # CPU smoke test:
    python scripts/train_solvers.py --model tiny-nemotron-h-solver --out out/sx --max-steps 2 --batch-size 1 \
        --workers 0 --eval-questions 2 --eval-max-gen-toks 16
"""

import dataclasses
import faulthandler
import itertools
import json
import math
import re
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from replayssm_eval.models.adapter import load_model
from replayssm_eval.models.tokenizer import EOS_TOKEN_ID, PAD_TOKEN_ID
from replayssm_eval.generate.generation import greedy_generate
from replayssm_eval.accuracy.synthetic import SYNTHETIC_TASKS, generate, prompt_and_target
from train_tiny import (
    MODELS, BetaPenalty, RunConfig, check_torch_paths, decay_table, init_long_heads, init_slow_heads, lr_at,
    make_optimizer, optimizer_step, parse_config, provenance, save, ssm_mixers, static_decay,
)

SOLVERS = {f"{name}-solver": name for name in MODELS}  # solver name -> architecture in train_tiny.MODELS
ROWS_PER_DRAW = 256  # examples drawn per generator call
ANSWER_RULES = {  # the tasks' final-answer rules: the last boxed answer / MMLU-Pro's "answer is (X)"
    "synth_sum": re.compile(r"\\boxed\{([^{}]*)\}"),
    "synth_swap": re.compile(r"answer is \(?([A-J])\)?"),
}


@dataclasses.dataclass(frozen=True)
class SolverConfig(RunConfig):
    """One training run on the synthetic tasks (the defaults that differ from train_tiny.py's, and its own options)."""

    model: str  # a key of SOLVERS
    time_budget: float = 420.0
    seq_len: int = 5120  # bytes per row: holds the longest example of either task
    batch_size: int = 8
    min_lr_ratio: float = 0.05
    long_heads: float = 0.5
    beta_penalty: float = 0.05
    workers: int = 4  # DataLoader processes generating examples
    eval_questions: int = 128  # test questions per task scored after training
    eval_max_gen_toks: int = 6144
    eval_batch: int = 128
    init_from: str = ""  # a model folder (a solver trained before) to continue from, instead of a fresh init
    scan_kernels: str = "torch"  # torch | fla: KDA's chunk rule from fla's Triton kernels (a GPU, training only)
    swap_share: float = 0.5  # the share of synth_swap examples in the training rows (the rest synth_sum)


# ---- data


def encode_example(task: str, row: dict) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of `prompt + target + eos`; the mask marks the target and eos bytes."""
    prompt, target = prompt_and_target(task, row)
    p, t = list(prompt.encode()), list(target.encode())
    return p + t + [EOS_TOKEN_ID], [0] * len(p) + [1] * (len(t) + 1)


class PackedExamples(torch.utils.data.IterableDataset):
    """Endless rows of seq_len + 1 ids (and their loss mask), packed with whole training examples.

    Example i is a `synth_swap` example where floor((i + 1) * swap_share) > floor(i * swap_share), else a
    `synth_sum` one (share 0.5: the tasks alternate). Worker w draws each task's rows ROWS_PER_DRAW at a time
    from training seeds seed * 1e9 + w * 1e6 + 0, 1, 2, ...
    """

    def __init__(self, seq_len: int, seed: int, swap_share: float):
        self.width, self.seed, self.swap_share = seq_len + 1, seed, swap_share

    def examples(self, worker: int):
        draws = {task: itertools.count() for task in SYNTHETIC_TASKS}
        rows = {task: iter(()) for task in SYNTHETIC_TASKS}
        for i in itertools.count():
            task = "synth_swap" if int((i + 1) * self.swap_share) > int(i * self.swap_share) else "synth_sum"
            row = next(rows[task], None)
            if row is None:
                seed = self.seed * 10**9 + worker * 10**6 + next(draws[task])
                rows[task] = iter(generate(task, "train", ROWS_PER_DRAW, seed=seed))
                row = next(rows[task])
            yield encode_example(task, row)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        ids, mask = [], []
        for example_ids, example_mask in self.examples(info.id if info else 0):
            if len(example_ids) > self.width:
                raise ValueError(f"an example of {len(example_ids)} bytes does not fit --seq-len {self.width - 1}")
            if len(ids) + len(example_ids) > self.width:
                pad = self.width - len(ids)
                yield torch.tensor(ids + [PAD_TOKEN_ID] * pad), torch.tensor(mask + [0] * pad, dtype=torch.bool)
                ids, mask = [], []
            ids, mask = ids + example_ids, mask + example_mask


def batches(cfg: SolverConfig):
    """(ids [B, L+1], mask [B, L+1]) batches on the device."""
    rows = PackedExamples(cfg.seq_len, cfg.seed, cfg.swap_share)
    loader = torch.utils.data.DataLoader(rows, batch_size=cfg.batch_size, num_workers=cfg.workers,
                                         pin_memory=cfg.device.startswith("cuda"))
    for ids, mask in loader:
        yield ids.to(cfg.device, non_blocking=True), mask.to(cfg.device, non_blocking=True)


# ---- train


def one_config_each(package: str = "fla.ops") -> int:
    """Give every Triton autotuner of the imported `package` modules one config (fewest stages, smallest tiles,
    fewest warps), so the first step compiles one variant per kernel rather than autotuning them all (fla's KDA
    backward alone compiled for over 6 minutes on an H200); returns the number of autotuners trimmed. The parity
    check runs after it."""
    from triton.runtime.autotuner import Autotuner

    def cost(config):
        return config.num_stages, math.prod(config.kwargs.values()), config.num_warps

    trimmed = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith(package):
            continue
        for kernel in vars(module).values():
            while kernel is not None and not isinstance(kernel, Autotuner):
                kernel = getattr(kernel, "fn", None) if hasattr(kernel, "run") else None  # through @heuristics
            if kernel is not None and len(kernel.configs) > 1:
                kernel.configs = [min(kernel.configs, key=cost)]
                trimmed += 1
    return trimmed


def use_fla_kda(device: str) -> str:
    """Bind fla's `chunk_kda` as the KDA chunk rule of transformers' kimi_linear, once it matches transformers'
    torch rule on random inputs (decays down to -8 per step), outputs and gradients; returns fla's version."""
    import fla
    from fla.ops.kda import chunk_kda
    from transformers.models.kimi_linear import modeling_kimi_linear as kimi

    print(f"[fla] {one_config_each()} autotuned kernels given one config each", flush=True)
    torch_rule = getattr(kimi.chunk_kimi_delta_attention, "__wrapped__", kimi.chunk_kimi_delta_attention)
    gen = torch.Generator(device).manual_seed(0)
    shape = (2, 300, 4, 64)  # [B, T, H, K]
    q, k, v = (torch.randn(shape, device=device, generator=gen).requires_grad_() for _ in range(3))
    g = (-8 * torch.rand(shape, device=device, generator=gen) ** 4).requires_grad_()  # log decays in (-8, 0]
    beta = torch.rand(shape[:3], device=device, generator=gen).requires_grad_()
    inputs = (q, k, v, g, beta)
    results = []
    for rule in (torch_rule, chunk_kda):
        out, _ = rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)  # [B, T, H, V]
        results.append((out, *torch.autograd.grad((out * torch.cos(out)).sum(), inputs)))
    for name, ref, got in zip(("output", "dq", "dk", "dv", "dg", "dbeta"), *results):
        torch.testing.assert_close(got, ref, rtol=0, atol=2e-3 * ref.abs().max().item(), msg=lambda m: f"fla {name}: {m}")
    kimi.chunk_kimi_delta_attention = chunk_kda
    return fla.__version__


def train(model: torch.nn.Module, cfg: SolverConfig, long_heads: list[list[int]]) -> dict:
    """Train in place until the time budget or max_steps; returns steps, wall time and the loss curve."""
    device = torch.device(cfg.device)
    optimizer = make_optimizer(model, cfg)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    penalty = BetaPenalty(model, long_heads)
    curve, beta, step = [], None, 0
    model.train()
    data = batches(cfg)
    faulthandler.dump_traceback_later(120, repeat=True)  # where the first step's compile and warm-up is, if it is slow
    start = last_time = time.perf_counter()
    last_step = 0
    while step < cfg.max_steps and time.perf_counter() - start < cfg.time_budget:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, step, time.perf_counter() - start)
        ids, mask = next(data)
        with autocast:
            logits = model(input_ids=ids[:, :-1], use_cache=False).logits  # [B, L, V]
        losses = F.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")  # [B, L]
        weight = mask[:, 1:].float()
        loss = (losses * weight).sum() / weight.sum().clamp(min=1)
        beta = optimizer_step(model, optimizer, loss, penalty, cfg)
        step += 1
        if step == 1:
            faulthandler.cancel_dump_traceback_later()
        if step == 1 or step % cfg.log_every == 0 or step == cfg.max_steps:  # step 1: the compile and warm-up time
            now, value = time.perf_counter(), loss.item()
            curve.append([step, round(now - start, 1), round(value, 5)])
            print(f"[{cfg.model}] step {step:5d}  target loss {value:.5f}  "
                  f"{1000 * (now - last_time) / (step - last_step):.0f} ms/step  {now - start:.0f} s"
                  + ("" if beta is None else f"  long-head beta {beta.item():.3f}"), flush=True)
            last_time, last_step = now, step
    return {"steps": step, "train_seconds": round(time.perf_counter() - start, 1), "loss_curve": curve,
            "long_heads": long_heads, "long_head_beta_last": None if beta is None else round(beta.item(), 4)}


# ---- evaluate


def answer_of(task: str, text: str) -> str | None:
    """The task's final answer in a generated text: the last match of its rule, or None."""
    found = ANSWER_RULES[task].findall(text)
    return found[-1].strip() if found else None


def held_out_accuracy(model_dir: Path, cfg: SolverConfig) -> dict:
    """Greedy FP32-state accuracy on the first eval_questions test questions of each task, overall and in the
    longest quarter of gold target lengths, from the stored weights."""
    rm = load_model(str(model_dir), dtype="float32", device=cfg.device)
    step = "triton" if cfg.device.startswith("cuda") else "reference"
    result = {}
    for task in SYNTHETIC_TASKS:
        rows = generate(task, "test", cfg.eval_questions)
        pairs = [prompt_and_target(task, row) for row in rows]
        start = time.perf_counter()
        gens = greedy_generate(rm, [list(p.encode()) for p, _ in pairs], config="fp32", step=step,
                               max_gen_toks=cfg.eval_max_gen_toks, max_batch=cfg.eval_batch,
                               until=["\n\n"])
        correct = [answer_of(task, g.text) == answer_of(task, target) for g, (_, target) in zip(gens, pairs)]
        gold_len = torch.tensor([len(target.encode()) for _, target in pairs], dtype=torch.float64)
        longest = gold_len >= gold_len.quantile(0.75)
        flags = torch.tensor(correct)
        result[task] = {
            "questions": len(rows),
            "accuracy": round(float(flags.float().mean()), 4),
            "accuracy_longest_quarter": round(float(flags[longest].float().mean()), 4),
            "longest_quarter_min_gold_bytes": int(gold_len[longest].min()),
            "mean_gen_tokens": round(sum(g.gen_tokens for g in gens) / len(gens), 1),
            "hit_max_gen_toks": sum(g.hit_max_gen_toks for g in gens),
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(f"[{cfg.model}] {task}: {result[task]}", flush=True)
    return result


# ---- main


def earlier_runs(init_from: str, result: dict) -> dict:
    """What a continued run records of the runs before it (from init_from/training.json, nested), with totals."""
    path = Path(init_from) / "training.json"
    if not init_from or not path.exists():
        return {}
    before = json.loads(path.read_text())
    kept = ("command", "steps", "train_seconds", "tokens_per_step", "scan_kernels", "loss_curve", "date", "git_rev",
            "device", "note", "continued_from")
    return {"continued_from": {key: before[key] for key in kept if key in before},
            "steps_total": before.get("steps_total", before["steps"]) + result["steps"],
            "train_seconds_total": round(before.get("train_seconds_total", before["train_seconds"])
                                         + result["train_seconds"], 1)}


def parse_args() -> SolverConfig:
    cfg = parse_config(SolverConfig, SOLVERS, __doc__.split("\n\n")[0])
    if not 0 <= cfg.swap_share <= 1:
        raise SystemExit(f"--swap-share {cfg.swap_share}: expected a fraction in [0, 1]")
    if cfg.scan_kernels not in ("torch", "fla"):
        raise SystemExit(f"--scan-kernels {cfg.scan_kernels!r}: expected torch or fla")
    if cfg.scan_kernels == "fla" and (SOLVERS[cfg.model] != "tiny-kimi-linear" or not cfg.device.startswith("cuda")):
        raise SystemExit(f"--scan-kernels fla trains KDA on a GPU only; got {cfg.model} on {cfg.device}")
    return cfg


def main() -> None:
    cfg = parse_args()
    check_torch_paths(allowed=("fla",) if cfg.scan_kernels == "fla" else ())
    scan_kernels = {"fla": use_fla_kda(cfg.device)} if cfg.scan_kernels == "fla" else {}
    torch.manual_seed(cfg.seed)
    config_fn, model_cls = MODELS[SOLVERS[cfg.model]]
    if cfg.init_from:
        model = model_cls.from_pretrained(cfg.init_from, dtype=torch.float32)
    else:
        model = model_cls(config_fn())
        init_slow_heads(model, torch.Generator().manual_seed(cfg.seed))
    long_heads = init_long_heads(model, cfg)  # (re)sets the long heads' fixed decay and keeps it fixed
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[{cfg.model}] {n_params:,} parameters ({SOLVERS[cfg.model]} architecture)", flush=True)

    model.to(cfg.device)
    result = train(model, cfg, long_heads)
    record = {
        "model": cfg.model,
        "model_class": model_cls.__name__,
        "parameters": n_params,
        "stored_dtype": "bfloat16",
        "command": "python " + shlex.join(sys.argv),
        "train_config": dataclasses.asdict(cfg),
        "tasks": list(SYNTHETIC_TASKS),
        "tokens_per_step": cfg.batch_size * cfg.seq_len,
        "scan_kernels": scan_kernels or "transformers' torch paths",
        **result,
        "decay_static": decay_table([static_decay(m).tolist() for m in ssm_mixers(model)]),
        **provenance(cfg.device, Path(__file__)),
        **earlier_runs(cfg.init_from, result),
    }
    out_dir = Path(cfg.out) / cfg.model
    save(model, out_dir, record)
    del model
    if cfg.eval_questions:
        record["held_out"] = held_out_accuracy(out_dir, cfg)
        (out_dir / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"[{cfg.model}] wrote {out_dir}", flush=True)


if __name__ == "__main__":
    main()

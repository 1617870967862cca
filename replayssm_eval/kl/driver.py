"""The teacher-forced KL run: prefill, then lockstep segments of the reference and every config.

For each batch of documents [B, prompt_len + tokens], every model stream (the FP32 reference and
each config, one `runner.Stream` each, carrying its SSM, conv and KV state) first prefills the
prompt; its last logits predict generated token 1. Then the tokens fed to the model,
doc[prompt_len : prompt_len + tokens - 1], go through in segments of `segment_len`: the
reference's segment logits [B, S, V] are kept while each config runs the same segment, and are
reduced at once to per-token scalars (`metrics.token_metrics`), so no [tokens, vocab] array ever
exists. `segment_len` is a multiple of every config's window, so each segment starts at window
position 0.

Fault handling. After every segment the batch's per-token metrics so far are stored atomically
(inflight/batch-*.npz, one file per batch, so each rank writes its own), and progress.json is
rewritten; a finished document is stored with its metrics and kl.json is re-rendered. The
carried state (HF caches and ReplayStates, GBs at 128K tokens) is saved only on Ctrl-C: the first
SIGINT is deferred to the end of the current segment (`interrupt`), where every stream has
consumed the same tokens, and a snapshot of the batch there (every stream's state and the metrics
so far, inflight/batch-*.pt) is written before the run stops. `--resume` continues each batch from
its snapshot, or else from its start (after a crash or a second Ctrl-C). Either way the numbers are
bit-identical to an uninterrupted run: a document's numbers depend only on its tokens, its batch
(fixed by index), its sequence id and the segment boundaries (fixed by the options), and the SR
bits are keyed by seed, layer, sequence, element and checkpoint index, not by process history.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from replayssm_eval.data.sources import TextSource, iter_documents
from replayssm_eval.data.tokens import TokenDocs, tokenize_documents
from replayssm_eval.options import resolve_device
from replayssm_eval.replay.config import DEFAULT_REPLAY_WINDOW, ReplayConfig
from replayssm_eval.kl import runner as runner_module
from replayssm_eval.kl.interrupt import deferred_interrupt
from replayssm_eval.kl.metrics import METRICS, token_metrics, token_nll
from replayssm_eval.kl.options import DEFAULT_CONFIGS, MAX_TOKENS, KLConfig
from replayssm_eval.kl.output import write_outputs
from replayssm_eval.kl.ranks import Ranks, barrier, batches_for_rank, gather_on_main, init_ranks, on_main
from replayssm_eval.results.buckets import Bucket, parse_buckets
from replayssm_eval.results.files import atomic_write_json, check_output_dir, read_json
from replayssm_eval.results.kl_store import (
    INFLIGHT_DIR,
    PROGRESS_FILE,
    RUN_FILE,
    TOKENS_DIR,
    check_snapshot,
    clear_inflight,
    load_documents,
    load_snapshot,
    save_document,
    save_partial,
    save_snapshot,
)
from replayssm_eval.results.kl_tables import SCHEMA_VERSION, config_results, reference_results
from replayssm_eval.results.provenance import git_state, versions

REFERENCE = ReplayConfig()


@dataclass(frozen=True)
class RunPlan:
    """Validated settings of a run, resolved from `KLConfig`."""

    options: KLConfig
    configs: tuple[ReplayConfig, ...]
    source: TextSource
    buckets: tuple[Bucket, ...]
    segment_len: int
    device: str
    dtype: str
    backend: str
    reference_scan: str

    def resolved(self) -> dict:
        """What the options resolved to, as recorded in kl.json."""
        return {
            "configs": [c.name for c in self.configs],
            "reference": REFERENCE.name,
            "source": self.source.name,
            "buckets": [[b.start, b.end] for b in self.buckets],
            "segment_len": self.segment_len,
            "device": self.device,
            "dtype": self.dtype,
            "backend": self.backend,
            "reference_scan": self.reference_scan,
        }


def make_plan(options: KLConfig) -> RunPlan:
    """Check every option that needs no model or data; errors name the value and what is accepted."""
    if not 1 <= options.tokens <= MAX_TOKENS:
        raise ValueError(f"--tokens {options.tokens} is out of range; accepted: 1..{MAX_TOKENS}")
    if options.window is not None and options.window < 1:
        raise ValueError(f"--window {options.window} is out of range; accepted: an integer >= 1")
    for name in ("prompt_len", "num_docs", "batch_size", "segment_len"):
        if getattr(options, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(options, name)}")
    if options.min_doc_tokens < 0:
        raise ValueError(f"--min-doc-tokens must be >= 0, got {options.min_doc_tokens}")
    configs = resolve_configs(options)
    too_long = [c.name for c in configs if c.speculative is None and max(c.windows) > options.tokens]
    if too_long:
        raise ValueError(f"config {', '.join(too_long)} has a window longer than the run (--tokens {options.tokens}); "
                         f"accepted: windows of at most {options.tokens} tokens")
    device = resolve_device(options.device)
    dtype = options.dtype if options.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    backend = options.backend if options.backend != "auto" else ("triton" if device == "cuda" else "torch")
    if backend == "triton" and device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("--backend triton needs a CUDA device and the device is cpu; accepted here: "
                         "--backend torch, or TRITON_INTERPRET=1 in the environment for Triton's (slow) interpreter")
    reference_scan = options.reference_scan
    if reference_scan == "auto":
        reference_scan = "kernels" if backend == "triton" else "hf"
    return RunPlan(
        options=options,
        configs=configs,
        source=TextSource(dataset=options.dataset, data_files=options.data_files),
        buckets=tuple(parse_buckets(options.buckets, options.tokens)),
        segment_len=aligned_segment_len(options.segment_len, configs),
        device=device,
        dtype=dtype,
        backend=backend,
        reference_scan=reference_scan,
    )


def resolve_configs(options: KLConfig) -> tuple[ReplayConfig, ...]:
    """--config entries, then the short form (--read/--recur/--window/--seed) as one split config."""
    configs = [ReplayConfig.parse(text) for text in options.config]
    short = (options.read, options.recur, options.window)
    if any(v is not None for v in short):
        window = DEFAULT_REPLAY_WINDOW if options.window is None else options.window
        text = f"{options.read or 'fp32'}/{options.recur or 'fp32'}@{window}"
        configs.append(ReplayConfig.parse(text + (f"#seed={options.seed}" if options.seed else "")))
    elif options.seed is not None:
        raise ValueError(f"--seed {options.seed} belongs to the short form (--read/--recur/--window); "
                         f"with --config write the seed as a tag, e.g. nvfp4/fp16sr#seed={options.seed}")
    if not configs:
        configs = [ReplayConfig.parse(text) for text in DEFAULT_CONFIGS]
    names = [c.name for c in configs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"config {', '.join(repeated)} is given more than once")
    return tuple(configs)


def aligned_segment_len(segment_len: int, configs) -> int:
    """`segment_len` rounded up to a multiple of every fixed window, of every part of a mixed config (speculative
    schedules have no fixed phase)."""
    step = math.lcm(*(w for c in configs if c.speculative is None for w in c.windows), 1)
    return -(-segment_len // step) * step


def run_kl(options: KLConfig) -> Path:
    """Run (or resume) a KL evaluation and return its output directory."""
    if options.resume:
        options = options_for_resume(options)
        if _is_complete(Path(options.output)):
            print(f"{options.output} is already complete; nothing to do", file=sys.stderr)
            return Path(options.output)
    plan = make_plan(options)
    ranks = init_ranks(plan.device)
    run_dir = Path(on_main(ranks, lambda: str(_output_dir(options))))  # checked before any loading
    tokenizer = runner_module.load_tokenizer(options.model)
    docs = tokenize_documents(
        iter_documents(plan.source),
        tokenizer,
        num_docs=options.num_docs,
        length=options.prompt_len + options.tokens,
        pack=options.pack,
        min_doc_tokens=options.min_doc_tokens,
        source_name=plan.source.name,
    )
    device = f"cuda:{ranks.local_rank}" if plan.device == "cuda" and ranks.world > 1 else plan.device
    runner = runner_module.load_runner(
        options.model, device=device, dtype=plan.dtype, backend=plan.backend, device_map=options.device_map,
        reference_scan=plan.reference_scan,
    )
    for config in plan.configs:
        runner.check(config)
    barrier(ranks)
    if ranks.is_main and not options.resume:
        run_dir.mkdir(parents=True, exist_ok=True)
        resumable = dataclasses.replace(options, output=str(run_dir))
        atomic_write_json(run_dir / RUN_FILE, {"options": dataclasses.asdict(resumable)})
    barrier(ranks)
    header = {
        "model": options.model,
        "command": command_line(dataclasses.replace(options, output=str(run_dir), resume=None)),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "options": dataclasses.asdict(options),
        "resolved": plan.resolved(),
        "documents": [[dataclasses.asdict(s) for s in spans] for spans in docs.spans],
    }
    traffic = {c.name: runner.state_traffic(c) for c in plan.configs}

    def render(done: dict, complete: bool) -> None:
        skips = {c.name: runner.skip_reads(c) for c in plan.configs}  # counted by this rank's closed streams
        _render(plan, run_dir, header, traffic, skips, runner.reference_checks, done, complete)

    try:
        done = _evaluate(plan, runner, docs, run_dir, ranks, on_document=lambda d: render(d, False))
    except KeyboardInterrupt:
        print(f"\ninterrupted; finished documents and any snapshot of the batch in flight are kept. "
              f"Continue with: replayssm-eval kl --resume {run_dir}", file=sys.stderr)
        raise
    merged = gather_on_main(ranks, done)
    if ranks.is_main:
        render(merged, True)
        (run_dir / PROGRESS_FILE).unlink(missing_ok=True)
        shutil.rmtree(run_dir / INFLIGHT_DIR, ignore_errors=True)
        if not options.keep_token_metrics:
            shutil.rmtree(run_dir / TOKENS_DIR, ignore_errors=True)
        print(f"wrote {run_dir}", file=sys.stderr)
    barrier(ranks)
    return run_dir


def command_line(options: KLConfig, name: str = "kl") -> str:
    """The `replayssm-eval <name>` command that gives `options` (only options that differ from the defaults)."""
    words = ["replayssm-eval", name]
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if value == default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        else:
            for item in value if isinstance(value, tuple) else (value,):
                words += [flag, str(item)]
    return shlex.join(words)


def options_for_resume(given: KLConfig) -> KLConfig:
    """The stored options of the run in `given.resume`; other options given must match them or be left out."""
    run_dir = Path(given.resume)
    if not (run_dir / RUN_FILE).is_file():
        raise ValueError(f"--resume {str(run_dir)!r}: no {RUN_FILE} there; it is not a kl run directory")
    if given.output is not None and Path(given.output) != run_dir:
        raise ValueError(f"--output {given.output!r} differs from --resume {given.resume!r}: a resumed run stays in "
                         "its directory; leave --output out")
    stored = read_json(run_dir / RUN_FILE)["options"]
    foreign = sorted(set(stored) - {f.name for f in dataclasses.fields(KLConfig)})
    if foreign:
        named = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ValueError(f"--resume {str(run_dir)!r} holds another kind of run (its {RUN_FILE} has {named}); "
                         "accepted: a kl run directory")
    stored = {k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()}
    for f in dataclasses.fields(KLConfig):
        if f.name in ("resume", "output"):
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        value = getattr(given, f.name)
        if value != default and value != stored[f.name]:
            flag = "--" + f.name.replace("_", "-")
            raise ValueError(f"{flag} {value!r} differs from the resumed run's {stored[f.name]!r} "
                             f"({run_dir / RUN_FILE}); leave it out when resuming")
    return dataclasses.replace(KLConfig(**stored), output=str(run_dir), resume=str(run_dir))


def _is_complete(run_dir: Path) -> bool:
    path = run_dir / "kl.json"
    return path.is_file() and read_json(path).get("complete", False)


def _output_dir(options: KLConfig) -> Path:
    """The run directory: --resume, --output, or reports/kl-<model>-<UTC time>; a new one must be empty,
    and creatable and writable (checked without creating it)."""
    if options.resume:
        path = Path(options.resume)
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"--resume {str(path)!r} is not writable; accepted: a run directory you can write to")
        return path
    if options.output:
        path = Path(options.output)
    else:
        model = options.model.rstrip("/").replace("/", "_")
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = Path("reports") / f"kl-{model}-{stamp}"
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"--output {str(path)!r} exists and is not an empty directory; "
                         f"choose another, or continue it with --resume {path}")
    return check_output_dir(path)


def _evaluate(plan: RunPlan, runner, docs: TokenDocs, run_dir: Path, ranks: Ranks, on_document) -> dict:
    """Run this rank's batches, skipping finished documents; returns index -> (metrics [C, M, N], ref_nll [N]),
    M = len(METRICS)."""
    options = plan.options
    names = [c.name for c in plan.configs]
    batches = batches_for_rank(len(docs), options.batch_size, ranks)
    done = load_documents(run_dir, [i for batch in batches for i in batch], names, options.tokens, len(METRICS))
    pending = [batch for batch in batches if any(i not in done for i in batch)]
    for batch in pending:
        check_snapshot(run_dir, batch, len(plan.configs), len(METRICS))
    bar = tqdm(total=sum(len(b) for b in pending) * options.tokens, unit="tok", unit_scale=True,
               desc=f"generated tokens x (fp32 + {len(plan.configs)} configs)", disable=not ranks.is_main)
    map_location = None if options.device_map else runner.device  # a device_map model keeps its devices
    with bar, deferred_interrupt() as interrupt:
        for batch in pending:
            interrupt.check()
            start = load_snapshot(run_dir, batch, map_location)
            if start is not None:
                bar.update(start["generated"] * len(batch))
            progress = SegmentProgress(bar, len(batch))
            metrics, ref_nll = evaluate_batch(
                runner, plan.configs, docs.tokens[batch], torch.tensor(batch), options.prompt_len,
                plan.segment_len, _segment_hook(run_dir, batch, names, ranks, progress, interrupt), start=start,
                on_progress=progress.within,
            )
            for row, index in enumerate(batch):
                save_document(run_dir, index, metrics[row], ref_nll[row], names)
                done[index] = (metrics[row], ref_nll[row])
            clear_inflight(run_dir, batch)
            if ranks.is_main:
                on_document(done)
    return done


class SegmentProgress:
    """Moves the bar (generated tokens x documents) within a segment, as each stream's forward goes through
    its layers, and to the exact count at each boundary; only whole units, so the total comes out exact."""

    def __init__(self, bar, width: int):
        self.bar, self.width, self.moved = bar, width, 0

    def within(self, tokens: float) -> None:
        """`tokens` of the current segment are done (a fraction of each stream's forwards counts)."""
        self._move_to(int(tokens * self.width))

    def boundary(self, new_tokens: int) -> None:
        """The segment of `new_tokens` tokens is done."""
        self._move_to(new_tokens * self.width)
        self.moved = 0

    def _move_to(self, target: int) -> None:
        if target > self.moved:
            self.bar.update(target - self.moved)
            self.moved = target


def _segment_hook(run_dir: Path, batch: list[int], names: list[str], ranks: Ranks, progress: SegmentProgress,
                  interrupt):
    """`evaluate_batch`'s on_segment: store the metrics so far; after a deferred Ctrl-C, snapshot and stop.

    At the batch's last boundary there is nothing to continue: the batch is stored instead, and the
    run stops before the next batch (or completes, if there is none).
    """

    def on_segment(here: Boundary, new_tokens: int) -> None:
        progress.boundary(new_tokens)
        save_partial(run_dir, batch, here.metrics[..., :here.generated].numpy(),
                     here.ref_nll[:, :here.generated].numpy(), names)
        if ranks.is_main:
            _write_progress(run_dir, batch, here, names)
        if interrupt.requested and not here.finished:
            path = save_snapshot(run_dir, batch, here.snapshot())
            tqdm.write(f"saved documents {batch} at generated token {here.generated}: {path}", file=sys.stderr)
            raise KeyboardInterrupt

    return on_segment


def _write_progress(run_dir: Path, batch: list[int], here: Boundary, names: list[str]) -> None:
    """progress.json: the batch in flight, the tokens generated so far, the running mean KL per config."""
    running = here.metrics[:, :, 0, :here.generated].mean(dim=(0, 2))  # [C]
    atomic_write_json(run_dir / PROGRESS_FILE, {
        "documents": batch, "generated": here.generated, "tokens": here.metrics.shape[-1],
        "kl_mean_so_far": dict(zip(names, running.tolist())),
    })


@dataclass
class Boundary:
    """The batch in flight at a segment boundary, where every stream has consumed the same tokens."""

    generated: int  # generated tokens whose metrics are done
    metrics: torch.Tensor  # [B, C, len(METRICS), N], columns [0, generated) filled
    ref_nll: torch.Tensor  # [B, N], the same columns filled
    streams: list  # the reference's, then each config's

    @property
    def finished(self) -> bool:
        return self.generated == self.metrics.shape[-1]

    def snapshot(self) -> dict:
        """What `evaluate_batch(start=...)` continues from: the position, the metrics so far, every stream's state."""
        return {
            "generated": self.generated,
            "metrics": self.metrics[..., :self.generated].clone(),
            "ref_nll": self.ref_nll[:, :self.generated].clone(),
            "streams": [s.save() for s in self.streams],
        }

    def resume(self, start: dict) -> None:
        """Take the position and the metrics of a snapshot (the streams are restored by `_open_streams`)."""
        self.generated = start["generated"]
        self.metrics[..., :self.generated] = start["metrics"]
        self.ref_nll[:, :self.generated] = start["ref_nll"]


def evaluate_batch(runner, configs, tokens: torch.Tensor, seq_ids: torch.Tensor, prompt_len: int,
                   segment_len: int, on_segment=None, start: dict | None = None,
                   on_progress=None) -> tuple[np.ndarray, np.ndarray]:
    """Per-token metrics of one batch.

    tokens: [B, prompt_len + N] int64; seq_ids: [B] int64 (key the SR bits).
    Returns metrics [B, C, len(METRICS), N] and ref_nll [B, N], float32.
    `on_segment(boundary, new_tokens)` is called after the prefill and after each segment with the
    `Boundary` reached; it may save `boundary.snapshot()` and raise to stop there.
    start: a `Boundary.snapshot()` of this batch to continue from instead of the prefill.
    `on_progress(tokens)` is called within a segment with how many of its tokens are done (fractional:
    the streams' forwards so far, from `runner.on_layer`).
    """
    batch, total = tokens.shape
    length = total - prompt_len
    tokens = tokens.to(runner.device)
    here = Boundary(
        generated=0,
        metrics=torch.empty(batch, len(configs), len(METRICS), length, dtype=torch.float32),
        ref_nll=torch.empty(batch, length, dtype=torch.float32),
        streams=_open_streams(runner, (REFERENCE, *configs), seq_ids, start),
    )

    def reached(generated: int, new_tokens: int) -> None:
        here.generated = generated
        if on_segment:
            on_segment(here, new_tokens)

    try:
        if start is None:
            # the prefill's last logits predict generated token 1
            _lockstep([s.prefill for s in here.streams], tokens[:, :prompt_len],
                      tokens[:, prompt_len:prompt_len + 1], here.metrics, here.ref_nll, slice(0, 1))
            reached(1, 1)
        else:
            here.resume(start)
        for a in range(here.generated - 1, length - 1, segment_len):
            b = min(a + segment_len, length - 1)
            inputs = tokens[:, prompt_len + a : prompt_len + b]  # [B, S], decode steps a..b-1
            targets = tokens[:, prompt_len + a + 1 : prompt_len + b + 1]  # [B, S], generated tokens a+2..b+1
            within = None if on_progress is None else (lambda done, s=b - a: on_progress(done * s))
            _lockstep([s.extend for s in here.streams], inputs, targets, here.metrics, here.ref_nll,
                      slice(a + 1, b + 1), runner, within)
            reached(b + 1, b - a)
    finally:
        for stream in here.streams:
            stream.close()
    return here.metrics.numpy(), here.ref_nll.numpy()


def _open_streams(runner, configs, seq_ids: torch.Tensor, start: dict | None) -> list:
    """A fresh stream per config, or the streams of the snapshot `start`."""
    if start is None:
        return [runner.open(c, seq_ids) for c in configs]
    return [runner.restore(c, seq_ids, saved) for c, saved in zip(configs, start["streams"], strict=True)]


def _lockstep(feeds, inputs, targets, metrics, ref_nll, cols: slice, runner=None, progress=None) -> None:
    """Feed one segment to the reference (feeds[0]), then to each config, reducing each config's logits at once.

    progress: None, or fn(fraction of the segment's forwards done), called through `runner.on_layer`.
    """

    def feed(k: int):
        if progress is not None:
            runner.on_layer = lambda done: progress((k + done) / len(feeds))
        try:
            return feeds[k](inputs)
        finally:
            if progress is not None:
                runner.on_layer = None

    ref_logits = feed(0)  # [B, S, V]
    ref_nll[:, cols] = token_nll(ref_logits, targets).cpu()
    for i in range(1, len(feeds)):
        metrics[:, i - 1, :, cols] = token_metrics(ref_logits, feed(i), targets).cpu()


def _render(plan: RunPlan, run_dir: Path, header: dict, traffic: dict, skips: dict, checks: dict, done: dict,
            complete: bool) -> None:
    """Write kl.json, the CSV and the plot from the finished documents `done` (checks: `Runner.reference_checks`)."""
    indices = sorted(done)
    metrics = np.stack([done[i][0] for i in indices])  # [D, C, len(METRICS), N]
    ref_nll = np.stack([done[i][1] for i in indices])  # [D, N]
    buckets = list(plan.buckets)
    report = {
        "schema_version": SCHEMA_VERSION,
        "complete": complete,
        "model": plan.options.model,
        "tokens": plan.options.tokens,
        "prompt_len": plan.options.prompt_len,
        "num_docs": plan.options.num_docs,
        "documents_done": len(indices),
        "document_indices": indices,
        "reference": {**reference_results(ref_nll, buckets), "scan": plan.reference_scan,
                      "scan_checks": {str(layer): check for layer, check in sorted(checks.items())}},
        "configs": [
            config_results(c, metrics[:, k], buckets, traffic[c.name], skips[c.name])
            for k, c in enumerate(plan.configs)
        ],
        "ci_method": "95% Student t-interval over per-document bucket means, lower bound clipped at 0",
        "versions": versions(),
        "git": git_state(),
        **header,
    }
    write_outputs(run_dir, report)

"""The accuracy run behind `replayssm-eval accuracy`: downstream accuracy of state formats against FP32, per FP32
length bucket.

    replayssm-eval accuracy --model nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16 --tasks gpqa_diamond,mmlu_pro,math_l5 \
        --configs fp32,shared:nvfp4,nvfp4/fp16sr,nvfp4/fp8sr --chat-template
    replayssm-eval accuracy --model tiny-qwen3.5 --data fixtures --limit 4 --max-gen-toks 64   # offline
    replayssm-eval accuracy ... --output reports/acc-run   # run again with the same options: resumes
    replayssm-eval accuracy ... --gen-kwargs temperature=0.6,top_p=0.95,top_k=20 --samples 8   # sampled, avg@8

FP32 runs first; its generation lengths define the buckets (`results.buckets`); every other config is
scored on the same questions (lm-eval's `samples=`, the FP32 run's doc ids) and read inside the
same buckets (`results.stats`). Sampled runs (`--gen-kwargs`, `--samples` n, `--sampling-seed`) draw sample j
of a question with the same random numbers under every config (`generate.sampling`); the model generates
the n samples of every question in one engine run, and lm-eval scores sample j in its j-th
evaluation. One (config, task) is the unit of work and of resumption:

    run.json                            the options (a rerun into this directory must give the same model,
                                        limit, data, max_gen_toks, chat_template, dtype, gen_kwargs, samples,
                                        sampling_seed; tasks and configs may grow)
    <config>/samples_<task>.jsonl       lm-eval's samples, plus sample, gen_tokens, hit_max_gen_toks, max_gen_toks
    <config>/results_<task>.json        lm-eval's results for the task (written last: marks it finished)
    accuracy.json, accuracy.md          rendered from the finished files (schema: docs/accuracy_json_schema.md;
                                        `output`)

`<config>` is the config's name with "/" written "+" (`results.accuracy_store`). Every file is written atomically.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from replayssm_eval.accuracy import FIXTURES_DIR, TASKS, YAML_DIR, TaskSpec, get_task
from replayssm_eval.accuracy.options import DATA_SOURCES, AccuracyConfig
from replayssm_eval.accuracy.quiet import quiet_lm_eval
from replayssm_eval.generate import FIXED_BUFFER_STEPS, split_configs
from replayssm_eval.generate.sampling import Sampling
from replayssm_eval.options import resolve_device
from replayssm_eval.replay.config import ReplayConfig
from replayssm_eval.results.accuracy_store import RUN_FILE, config_dir, save_task
from replayssm_eval.results.buckets import parse_spec
from replayssm_eval.results.files import atomic_write_bytes, atomic_write_json, check_output_dir, read_json

REFERENCE = ReplayConfig()
# options that must match when a run directory is continued (the others only say how to compute)
# (configs and tasks may be added: finished ones are reused)
_RESUME_KEYS = ("model", "limit", "data", "max_gen_toks", "chat_template", "dtype", "gen_kwargs", "samples", "sampling_seed")


@dataclass(frozen=True)
class Plan:
    """Validated options: the task specs, the configs (FP32 first), the data directory (None: the hub), the sampling."""

    options: AccuracyConfig
    tasks: tuple[TaskSpec, ...]
    configs: tuple[ReplayConfig, ...]
    data_dir: str | None
    sampling: Sampling

    @property
    def gen_kwargs(self) -> dict | None:
        """lm-eval's gen_kwargs of every task: --max-gen-toks and the sampling settings (None: the tasks' own)."""
        kwargs = {"max_gen_toks": self.options.max_gen_toks} if self.options.max_gen_toks else {}
        if not self.sampling.greedy:
            kwargs.update(do_sample=True, **self.sampling.as_dict())
        return kwargs or None

    def task_name(self, spec: TaskSpec) -> str:
        return spec.hub if self.data_dir is None else spec.local


def make_plan(options: AccuracyConfig) -> Plan:
    """Check every option that needs no model or data; errors name the value and what is accepted."""
    names = [t.strip() for t in options.tasks.split(",") if t.strip()]
    if not names:
        raise ValueError(f"--tasks is empty; known: {', '.join(TASKS)}")
    tasks = tuple(dict.fromkeys(get_task(name) for name in names))
    configs = [ReplayConfig.parse(text) for text in split_configs(options.configs)]
    configs = [REFERENCE, *(c for c in dict.fromkeys(configs) if c != REFERENCE)]
    if options.max_batch_size != "auto" and (not options.max_batch_size.isdigit() or int(options.max_batch_size) < 1):
        raise ValueError(f"--max-batch-size must be a positive integer or auto, got {options.max_batch_size!r}")
    for name in ("limit", "max_gen_toks", "prefill_segment", "prefill_tokens", "bootstrap_iters", "samples"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if options.sampling_seed < 0:
        raise ValueError(f"--sampling-seed must be >= 0, got {options.sampling_seed}")
    sampling = Sampling.from_text(options.gen_kwargs or "")
    if options.samples > 1 and sampling.greedy:
        raise ValueError(f"--samples {options.samples} needs sampling: greedy samples are all the same; give "
                         "--gen-kwargs with a temperature > 0 (e.g. temperature=0.6,top_p=0.95,top_k=20)")
    if options.step in FIXED_BUFFER_STEPS:
        from replayssm_eval.kernels.static_step import check_static_config  # the Triton kernels' module: on demand

        for c in configs:
            check_static_config(c, f"--step {options.step}", "--step triton")
    parse_spec(options.buckets)
    if options.data == "hub":
        data_dir = None
    elif options.data == "fixtures":
        data_dir = str(FIXTURES_DIR)
    elif Path(options.data).is_dir():
        data_dir = str(Path(options.data).resolve())
    else:
        raise ValueError(f"--data {options.data!r} is not a directory; accepted: {DATA_SOURCES}")
    resolve_device(options.device)
    if options.generations and not Path(options.generations).is_file():
        raise ValueError(f"--generations {options.generations!r} is not a file; accepted: a generations .jsonl "
                         "written by `python -m replayssm_eval.generate.offline`")
    if options.export_requests:
        check_output_dir(Path(options.export_requests).parent, "--export-requests")
    elif options.output:
        check_output_dir(Path(options.output))
    return Plan(options, tasks, tuple(configs), data_dir, sampling)


def run_accuracy(options: AccuracyConfig) -> Path:
    """Run (or continue) an accuracy comparison; returns its directory (with --export-requests: that file)."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise ValueError(f"accuracy needs lm-eval, which is not installed ({err}); "
                         f'install it with: pip install -e ".[eval]"') from err

    from replayssm_eval.accuracy.lm_model import ReplaySSMLM
    from replayssm_eval.accuracy.output import render
    from replayssm_eval.accuracy.recorded import RecordedLM

    plan = make_plan(options)
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("run accuracy in the main thread: math_verify scores with signal.alarm, main thread only")
    recorded = RecordedLM(options.generations, sampling_seed=options.sampling_seed) if options.generations else None
    # our YAMLs include lm-eval's by path (task_base.IncludedTask): indexing lm-eval's own thousands is not needed
    manager = TaskManager(include_path=str(YAML_DIR), include_defaults=False,
                          metadata={"data_dir": plan.data_dir} if plan.data_dir else None)
    tasks = {spec.name: _load_task(manager, plan, spec) for spec in plan.tasks}
    if options.export_requests:
        return _export_requests(plan, manager, tasks)
    if recorded is not None:
        lm = recorded
    else:
        lm = ReplaySSMLM(pretrained=options.model, device=options.device, dtype=options.dtype,
                         batch_size=options.max_batch_size, prefill_segment=options.prefill_segment,
                         prefill_tokens=options.prefill_tokens, device_map=options.device_map, step=options.step,
                         sampling_seed=options.sampling_seed)
        lm.samples = options.samples  # every sample of a question in one engine run
        for config in plan.configs:
            lm.rm.check_config(config)
    run_dir = _run_dir(plan)
    header = _header(plan, tasks)
    for config in plan.configs:
        lm.config = config
        for spec in plan.tasks:
            folder = config_dir(run_dir, config)
            if (folder / f"results_{spec.name}.json").is_file():
                continue
            doc_ids = None if config == REFERENCE else _doc_ids(config_dir(run_dir, REFERENCE), spec)
            # after FP32, rows enter longest FP32 generation first: rows of a batch stop at about the same time
            lm.length_hint = None if config == REFERENCE else _fp32_lengths(config_dir(run_dir, REFERENCE), spec, plan)
            evaluations = []  # (lm-eval's results, the generation records) of each sample index
            for j in range(options.samples):
                lm.sample = j
                evaluations.append((_evaluate(lm, plan, manager, spec, doc_ids), lm.records))
            run = {"config": config.name, "task": spec.name, "samples": len(evaluations),
                   "sampling": plan.sampling.as_dict(), "sampling_seed": options.sampling_seed}
            save_task(folder, spec.name, plan.task_name(spec), evaluations, run)
        render(run_dir, plan, header)
    return run_dir


def _evaluate(lm, plan: Plan, manager, spec: TaskSpec, doc_ids: list[int] | None) -> dict:
    """lm-eval's simple_evaluate of one task: the first --limit questions, or exactly `doc_ids`."""
    import lm_eval

    options = plan.options
    task = _load_task(manager, plan, spec)
    with quiet_lm_eval():
        return lm_eval.simple_evaluate(
            model=lm, tasks=[task], task_manager=manager,
            limit=None if doc_ids else options.limit, samples={plan.task_name(spec): doc_ids} if doc_ids else None,
            log_samples=True, bootstrap_iters=0, apply_chat_template=options.chat_template,
            gen_kwargs=plan.gen_kwargs,
        )


def _export_requests(plan: Plan, manager, tasks) -> Path:
    """--export-requests: the generation requests of every task, one JSON line each (no model is loaded)."""
    from replayssm_eval.accuracy.recorded import RequestRecorder

    recorder = RequestRecorder()
    for spec in plan.tasks:
        _evaluate(recorder, plan, manager, spec, None)
    path = Path(plan.options.export_requests)
    run = {"samples": plan.options.samples, "sampling_seed": plan.options.sampling_seed}
    atomic_write_bytes(path, "".join(json.dumps({**r, **run}, ensure_ascii=False) + "\n" for r in recorder.requests).encode())
    return path


def _load_task(manager, plan: Plan, spec: TaskSpec):
    """The lm-eval task object, its dataset loaded; a dataset that cannot be read is a clear ValueError."""
    name = plan.task_name(spec)
    try:
        with quiet_lm_eval():
            return manager.load([name])["tasks"][name]
    except Exception as err:  # datasets raises many types; the cause is kept and shown
        raise ValueError(f"missing dataset for task {spec.name} ({name}): {type(err).__name__}: {err}; "
                         f"--data accepts {DATA_SOURCES}") from err


def _doc_ids(fp32_dir: Path, spec: TaskSpec) -> list[int]:
    """Sorted doc ids of the FP32 samples of `spec` (lm-eval's `samples=` wants them sorted)."""
    with open(fp32_dir / f"samples_{spec.name}.jsonl", encoding="utf-8") as f:
        return sorted({json.loads(line)["doc_id"] for line in f})


def _fp32_lengths(fp32_dir: Path, spec: TaskSpec, plan: Plan) -> dict:
    """{(lm-eval task name, doc_id, sample): FP32 gen_tokens} of a finished FP32 task."""
    with open(fp32_dir / f"samples_{spec.name}.jsonl", encoding="utf-8") as f:
        return {(plan.task_name(spec), s["doc_id"], s.get("sample", 0)): s["gen_tokens"] for s in map(json.loads, f)}


def _run_dir(plan: Plan) -> Path:
    """The output directory with run.json; an existing run there must have been started with the same options."""
    options = plan.options
    if options.output:
        path = Path(options.output)
    else:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = Path("reports") / f"accuracy-{Path(options.model).name}-{stamp}"
    settings = {k: getattr(options, k) for k in _RESUME_KEYS}
    defaults = {f.name: f.default for f in dataclasses.fields(AccuracyConfig)}  # of keys older runs did not record
    if (path / RUN_FILE).is_file():
        stored = read_json(path / RUN_FILE)["options"]
        differ = [k for k in _RESUME_KEYS if stored.get(k, defaults[k]) != settings[k]]
        if differ:
            raise ValueError(f"{path} holds a run with other options ({', '.join(f'{k}={stored.get(k)!r}' for k in differ)}); "
                             "give the same ones to continue it, or another --output")
    elif path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"--output {str(path)!r} exists and is not an accuracy run directory; choose another")
    else:
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path / RUN_FILE, {"options": dataclasses.asdict(options)})
    return path


def _header(plan: Plan, tasks: dict) -> dict:
    """Provenance of accuracy.json: model, command, date, versions, git, seeds, per-task settings."""
    from importlib.metadata import version

    from replayssm_eval.accuracy.yaml.gpqa_diamond.utils import SHUFFLE_SEED
    from replayssm_eval.results.provenance import git_state, versions
    from replayssm_eval.results.stats import BOOTSTRAP_SEED

    return {
        "model": plan.options.model,
        "command": command_line(plan.options),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": {**versions(), **{p: version(p) for p in ("lm_eval", "datasets", "math-verify")}},
        "git": git_state(),
        "seeds": {
            "gpqa_choice_shuffle": SHUFFLE_SEED,
            "bootstrap": BOOTSTRAP_SEED,
            "lm_eval": "simple_evaluate defaults (random 0, numpy 1234, torch 1234, fewshot 1234)",
            "stochastic_rounding": {c.name: c.seed for c in plan.configs},
            "sampling": plan.options.sampling_seed,
        },
        "sampling": {"do_sample": not plan.sampling.greedy, **plan.sampling.as_dict(), "samples": plan.options.samples,
                     "seed": plan.options.sampling_seed},
        "data": plan.options.data,
        "generations": plan.options.generations,
        "task_settings": {
            spec.name: {"lm_eval_task": plan.task_name(spec), "metric": spec.metric, "filter": spec.filter,
                        "max_gen_toks": plan.options.max_gen_toks or tasks[spec.name].config.generation_kwargs["max_gen_toks"]}
            for spec in plan.tasks
        },
    }


def command_line(options: AccuracyConfig) -> str:
    """The `replayssm-eval accuracy` command that gives `options` (only options that differ from the defaults)."""
    words = ["replayssm-eval", "accuracy"]
    for f in dataclasses.fields(AccuracyConfig):
        value = getattr(options, f.name)
        if value != f.default:
            flag = "--" + f.name.replace("_", "-")
            words += [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
    return shlex.join(words)

"""Hand-made inputs of the suite's statistics metrics: the KL formulas, length buckets and their interval, the
accuracy comparison (paired interval, McNemar and sign-flip p-values, buckets by FP32 length) and the loop
detector. Every input is small integers (or exact binary fractions), so each metric moves only when a formula does.

    kl_formula_metrics()   `kl.metrics.token_metrics` on 4 tokens whose KL(p||q) and KL(q||p) differ by 1.5-3x
    kl_bucket_metrics()    `results.buckets.bucket_stats` of 3 documents x 8 tokens (t-interval with 2 degrees of freedom)
    loop_metrics()         `generate.degeneration.loop_span` of sequences at and just past its thresholds
    accuracy_metrics()     `results.accuracy_tables.task_report` of a task with 24 questions (1 sample) and of one
                           with 12 questions x 4 samples, config lengths and loops unlike FP32's
"""

from __future__ import annotations

import numpy as np
import torch

ACCURACY_ITERS = 2000  # bootstrap resamples (seeded: the interval is a fixed number)
ACCURACY_BUCKETS = "quantile:3"

# [tokens, V]: peaked vs flat, two modes vs one, -inf at one id in both, identical rows
_REF_LOGITS = ((4, 0, 0, 0, 0, 0), (3, 3, 0, -2, 0, 0), (0, 1, 2, 3, float("-inf"), 0), (1, 2, 0, 0, 1, 0))
_CFG_LOGITS = ((1, 1, 1, 0, 0, 0), (3, -1, 0, 0, 0, 0), (2, 1, 0, 3, float("-inf"), -1), (1, 2, 0, 0, 1, 0))
_TARGETS = (0, 1, 3, 4)


def kl_formula_metrics() -> dict[str, float]:
    """`kl/formula/t<i>/<metric>` of `token_metrics` (kl, reverse_kl, top1_agree, nll_diff, delta_p) per token."""
    from replayssm_eval.kl.metrics import METRICS, token_metrics

    out = token_metrics(torch.tensor(_REF_LOGITS)[None], torch.tensor(_CFG_LOGITS)[None],
                        torch.tensor(_TARGETS)[None])[0]  # [metrics, T]
    return {f"kl/formula/t{t}/{name}": float(out[m, t]) for m, name in enumerate(METRICS) for t in range(out.shape[1])}


def kl_bucket_metrics() -> dict[str, float]:
    """`kl/buckets/<start>-<end>/<statistic>` of `bucket_stats` on 3 documents x 8 tokens, buckets 1-3, 4-8."""
    from replayssm_eval.results.buckets import bucket_stats, parse_buckets

    kl = ((np.arange(24, dtype=np.float32).reshape(3, 8) * 7) % 11 + 1) / 8  # [D, T], document means differ
    reverse = kl * np.float32(1.5) + np.float32(0.125)
    top1 = (np.arange(24).reshape(3, 8) % 3 != 0).astype(np.float32)
    nll = (np.arange(24, dtype=np.float32).reshape(3, 8) % 4 - 1) / 4
    delta_p = (np.arange(24, dtype=np.float32).reshape(3, 8) * 5 % 9 - 4) / 16
    out = {}
    for bucket in parse_buckets("1,4", 8):
        for key, value in bucket_stats(kl, reverse, top1, nll, delta_p, bucket).items():
            if key not in ("start", "end"):
                out[f"kl/buckets/{bucket.start}-{bucket.end}/{key}"] = float(value)
    return out


# name -> token ids: loops right at the thresholds (MIN_TAIL 64, MIN_REPEATS 4, MAX_SPAN 100) and one short of them
LOOPS = {
    "p1_tail64": [7, 8, 9] + [5] * 64,
    "p1_tail63": [7, 8, 9] + [5] * 63,
    "p16_x4": [1, 2] + list(range(100, 116)) * 4,
    "p17_x4": list(range(200, 217)) * 4,
    "p17_x3": [9] * 20 + list(range(200, 217)) * 3,
    "p25_x3": [9] * 30 + list(range(300, 325)) * 3,
    "p100_x4": list(range(1000, 1100)) * 4,
    "p101_x4": list(range(1000, 1101)) * 4,
    "p3_prefixed": [4, 4, 4, 4] + [1, 2, 3] * 30,
}


def loop_metrics() -> dict[str, float]:
    """`stats/loop/<name>`: the loop span `loop_span` finds in each sequence of LOOPS (0: no loop)."""
    from replayssm_eval.generate.degeneration import loop_span

    return {f"stats/loop/{name}": float(loop_span(ids) or 0) for name, ids in LOOPS.items()}


def _samples(correct, lengths, limit: int, loop_ids) -> dict[int, list[tuple]]:
    """`accuracy_store.load_samples`' form: doc -> [(correct, gen_tokens, hit_max, max_gen_toks, loop)] per sample."""
    from replayssm_eval.generate.degeneration import is_loop

    return {q: [(bool(c), int(n), int(n) >= limit, limit, is_loop(LOOPS[ids]))
                for c, n, ids in zip(correct[q], lengths[q], loop_ids[q])] for q in range(len(correct))}


def _task(questions: int, samples: int) -> tuple[dict, dict]:
    """FP32 and config samples: the config flips some answers both ways, generates other lengths (so bucketing by
    its lengths instead of FP32's moves questions) and loops on other questions."""
    q = np.arange(questions * samples).reshape(questions, samples)
    limit = 96
    fp32_correct = (q * 7) % 5 < 3
    cfg_correct = np.where(q % 6 == 1, ~fp32_correct, fp32_correct) & ((q * 5) % 11 != 2)
    fp32_len = 8 + (q * 37) % (limit - 8)  # [Q, n] in 8..95
    cfg_len = np.where(q % 4 == 0, limit, np.maximum(1, limit - 1 - fp32_len))
    names = list(LOOPS)
    fp32_loops = [[names[(3 * i) % len(names)] if i % 5 == 0 else "p17_x3" for i in row] for row in q]
    cfg_loops = [[names[i % len(names)] for i in row] for row in q]
    return (_samples(fp32_correct, fp32_len, limit, fp32_loops), {"cfg": _samples(cfg_correct, cfg_len, limit, cfg_loops)})


def _flatten(prefix: str, entry: dict) -> dict[str, float]:
    """Numeric leaves of one accuracy.json bucket entry, the config's under `cfg/`."""
    out = {f"{prefix}/{k}": float(v) for k, v in entry.items() if isinstance(v, (int, float))}
    out.update({f"{prefix}/cfg/{k}": float(v) for k, v in entry["configs"]["cfg"].items() if v is not None})
    return out


def accuracy_metrics() -> dict[str, float]:
    """`stats/accuracy/<task>/<all|b<k>>/...`: accuracy.json's numbers of two hand-made tasks (1 and 4 samples)."""
    from replayssm_eval.accuracy import TaskSpec
    from replayssm_eval.results.accuracy_tables import task_report

    out = {}
    for name, questions, samples in (("n1", 24, 1), ("n4", 12, 4)):
        fp32, configs = _task(questions, samples)
        report = task_report(TaskSpec(name, "exact_match", "none"), fp32, configs, ACCURACY_BUCKETS, ACCURACY_ITERS)
        out.update(_flatten(f"stats/accuracy/{name}/all", report["all"]))
        for k, entry in enumerate(report["buckets"]):
            out.update(_flatten(f"stats/accuracy/{name}/b{k}", entry))
    return out

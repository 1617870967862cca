"""Hand-built results in the kl.json (docs/kl_json_schema.md) and accuracy.json (docs/accuracy_json_schema.md)
schemas, for the report renderers."""

from replayssm_eval.models.traffic import state_traffic

BUCKETS = [(1, 1), (2, 3), (4, 7), (8, 16)]


def kl_report(model="nemotron-3-nano-4b", configs=("shared:nvfp4", "nvfp4/fp16sr", "nvfp4/fp32"), docs=3,
              traffic=True):
    """A kl.json: KL grows with length, shared:nvfp4 worst; traffic from the model's preset."""
    scale = {"shared:nvfp4": 1e-3, "nvfp4/fp16sr": 1e-4, "nvfp4/fp32": 8e-5, "nvfp4/fp8sr": 2e-4}
    out = []
    for name in configs:
        buckets = []
        for i, (start, end) in enumerate(BUCKETS):
            mean = scale.get(name, 1e-4) * (1 + i)
            buckets.append({"start": start, "end": end, "count": docs * (end - start + 1), "kl_mean": mean,
                            "kl_median": mean / 2, "kl_p99": 5 * mean, "kl_ci_low": mean * 0.5 if docs > 1 else None,
                            "kl_ci_high": mean * 1.5 if docs > 1 else None, "top1_agree": 0.99,
                            "reverse_kl_mean": mean, "nll_diff_mean": mean / 3})
        out.append({"name": name, "read": "nvfp4", "recur": name.split("/")[-1].replace("shared:", ""),
                    "shared": name.startswith("shared"), "window": 16, "seed": 0, "gdn_fold": "open",
                    "kl_mean": scale.get(name, 1e-4) * 2, "reverse_kl_mean": 1e-4, "top1_agree": 0.99,
                    "nll_diff_mean": 1e-4, "state_traffic": state_traffic(model, name) if traffic else None,
                    "buckets": buckets})
    return {
        "schema_version": 1, "complete": True, "model": model, "tokens": 16, "prompt_len": 8, "num_docs": docs,
        "documents_done": docs, "document_indices": list(range(docs)),
        "reference": {"name": "fp32", "nll_mean": 1.5,
                      "buckets": [{"start": s, "end": e, "count": docs * (e - s + 1), "nll_mean": 1.5} for s, e in BUCKETS]},
        "configs": out, "ci_method": "95% Student t-interval",
        "documents": [[{"title": "macbeth_gut", "url": "", "start": 0, "num_tokens": 24}]] * docs,
        "versions": {"python": "3.11.7", "torch": "2.13.0", "transformers": "5", "triton": None,
                     "replayssm_eval": "0.1.0"},
        "git": {"commit": "0123456789abcdef", "dirty": False},
        "command": f"replayssm-eval kl --model {model} --tokens 16", "date": "2025-01-01T00:00:00+00:00",
        "options": {}, "resolved": {"configs": list(configs), "reference": "fp32", "source": "bundled text",
                                    "buckets": [list(b) for b in BUCKETS], "segment_len": 16, "device": "cpu",
                                    "dtype": "float32", "backend": "torch"},
    }


def accuracy_report(model="nemotron-3-nano-4b"):
    """accuracy.json: tasks -> {name -> buckets: [{start, end, n, fp32_acc, configs: {config -> {...}}}]}."""
    def config(acc, fp32, low, high, p, to_wrong, to_right):
        return {"acc": acc, "gap": acc - fp32, "ci_low": low, "ci_high": high, "p_value": p,
                "flips_to_wrong": to_wrong, "flips_to_right": to_right}

    return {
        "model": model, "seed": 1234, "command": "replayssm-eval accuracy --model ... --tasks gpqa_diamond",
        "date": "2025-01-02T00:00:00+00:00", "git": {"commit": "fedcba9876543210", "dirty": True},
        "versions": {"lm_eval": "0.4.9"},
        "tasks": {"gpqa_diamond": {"max_gen_toks": 4096, "all": {
            "start": 1, "end": 4096, "n": 132, "fp32_acc": 0.46, "fp32_truncated": 0.1,
            "configs": {"shared:nvfp4": config(0.35, 0.46, -0.17, -0.05, 0.001, 19, 4),
                        "nvfp4/fp16sr": config(0.46, 0.46, -0.04, 0.04, 1.0, 5, 5)}}, "buckets": [
            {"start": 1, "end": 900, "n": 66, "fp32_acc": 0.62,
             "configs": {"shared:nvfp4": config(0.5, 0.62, -0.2, -0.04, 0.01, 10, 2),
                         "nvfp4/fp16sr": config(0.63, 0.62, -0.05, 0.07, 0.8, 3, 4)}},
            {"start": 901, "end": 4096, "n": 66, "fp32_acc": 0.3, "fp32_truncated": 0.2,
             "fp32_mean_gen_tokens": 2500.4, "fp32_loop_rate": 0.05,
             "configs": {"shared:nvfp4": {**config(0.2, 0.3, -0.18, -0.02, 0.03, 9, 2),
                                          "mean_gen_tokens": 3900.0, "truncated": 0.75, "loop_rate": 0.5},
                         "nvfp4/fp16sr": config(0.29, 0.3, -0.06, 0.04, 1.0, 2, 1)}},
        ]}},
    }

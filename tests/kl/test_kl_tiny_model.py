"""The KL driver on the real bundled tiny model (CPU): the CLI end to end, and the token-by-token slow path."""

import json

import pytest
import torch

from replayssm_eval.cli import main
from replayssm_eval.kernels.config import ReplayConfig
from replayssm_eval.kl import runner as runner_module
from replayssm_eval.kl.driver import evaluate_batch
from replayssm_eval.kl.metrics import token_metrics
from replayssm_eval.models import token_by_token_logits

MODEL = "tiny-nemotron-h"


def test_cli_end_to_end(tmp_path):
    out = tmp_path / "run"
    code = main(["kl", "--model", MODEL, "--tokens", "128", "--prompt-len", "64", "--num-docs", "2",
                 "--config", "fp32", "--config", "fp32/fp32@16", "--config", "nvfp4/fp16sr@16",
                 "--config", "shared:nvfp4", "--segment-len", "64", "--device", "cpu", "--output", str(out)])
    assert code == 0
    configs = {c["name"]: c for c in json.loads((out / "kl.json").read_text())["configs"]}
    assert configs["fp32"]["kl_mean"] == 0.0 and all(b["kl_p99"] == 0.0 for b in configs["fp32"]["buckets"])
    assert configs["fp32/fp32"]["kl_mean"] < 1e-9  # window 16 with an FP32 state: float noise at most
    assert configs["nvfp4/fp16sr"]["kl_mean"] > 0
    assert configs["shared:nvfp4"]["kl_mean"] > configs["nvfp4/fp16sr"]["kl_mean"]
    traffic = configs["nvfp4/fp16sr"]["state_traffic"]
    assert traffic["config"] == "nvfp4/fp16sr" and traffic["per_model"]["ratio"] > 1
    assert (out / "kl_vs_length.png").stat().st_size > 0


@pytest.fixture(scope="module")
def tiny_runner():
    return runner_module.load_runner(MODEL, device="cpu", dtype="float32", backend="torch", device_map=None)


# split configs: the low-precision read copy never feeds the recurrence, so float32 noise between the
# chunked and the token-by-token paths (~1e-5 in logits) cannot flip an NVFP4 rounding that persists
@pytest.mark.parametrize("config", ["nvfp4/fp16@4", "nvfp4/fp32@8"])
def test_driver_matches_token_by_token_decoding(tiny_runner, config):
    prompt_len, tokens = 16, 32
    ids = torch.tensor([list(b"When shall we three meet again? In thunder, lightning, or in rain?")])
    ids = ids[:, : prompt_len + tokens]  # [1, 48]
    cfg = ReplayConfig.parse(config)
    metrics, _ = evaluate_batch(tiny_runner, [cfg], ids, torch.tensor([5]), prompt_len, segment_len=8)
    got = torch.from_numpy(metrics[:, 0])  # [1, 4, tokens]

    fed = ids[:, :-1]  # the last token is only a target
    slow = {c: token_by_token_logits(tiny_runner.replay_model, fed, prompt_len=prompt_len, config=c, seq_ids=[5])
            for c in ("fp32", cfg)}
    cols = slice(prompt_len - 1, None)  # the logits that predict generated tokens 1..tokens
    expected = token_metrics(slow["fp32"][:, cols], slow[cfg][:, cols], ids[:, prompt_len:])
    assert expected[0, 0].max() > 1e-6
    torch.testing.assert_close(got[:, :2], expected[:, :2], rtol=1e-2, atol=2e-5)  # KL, reverse KL
    torch.testing.assert_close(got[:, 2], expected[:, 2], rtol=0, atol=0)  # top-1 agreement
    torch.testing.assert_close(got[:, 3], expected[:, 3], rtol=0, atol=1e-4)  # NLL difference

"""State round trips on the bundled tiny models: through fp32 they change nothing, bit for bit; the generation engine
restores them on its session steps at each row's own positions (its fixed-buffer steps: tests/tasks/test_engine.py)."""

import pytest
import torch

from replayssm_eval.generate.engine import Engine
from replayssm_eval.kernels.round_trip import round_trip
from replayssm_eval.models import session as session_module
from replayssm_eval.models.fixtures import BUNDLED_MODELS
from tests.helpers.generation import tiny_model

CUTS = (16, 21, 33, 40)  # the prompt, then three calls


def _logits(rm, config, ids, engine):
    session = rm.new_session(config, seq_ids=[3, 4], engine=engine)
    out, start = [], 0
    for stop in CUTS:
        out.append(rm.forward(ids[:, start:stop], session, logits_to_keep=1 if not start else 0))
        start = stop
    return torch.cat(out, dim=1)


# one model in the quick tier (the delta-rule models take minutes in the interpreter: the slow tier)
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "tiny-nemotron-h" else pytest.mark.slow)
                                  for n in BUNDLED_MODELS])
def test_round_trip_through_fp32_changes_nothing(name):
    """The round trips cut each call at their positions; the device's own backend (torch on the CPU, Triton on a GPU)
    gives the same bits however a call is cut. The torch form on a GPU does not: its einsums over the call's windows
    run cuBLAS at other shapes (up to 8e-4 apart in a tiny model's logits on an H100)."""
    rm = tiny_model(name)
    ids = torch.randint(3, 250, (2, CUTS[-1]), generator=torch.Generator().manual_seed(0)).to(rm.model.device)
    for config, engine in (("fp16", "chunked"), ("fp32", "reference")):
        assert torch.equal(_logits(rm, config, ids, engine), _logits(rm, f"{config}#rt=fp32@every:5", ids, engine))
    lossy = _logits(rm, "fp16#rt=int8:axis=headdim@prompt", ids, "chunked")
    assert torch.equal(lossy[:, :1], _logits(rm, "fp16", ids, "chunked")[:, :1])  # the prompt's own logits
    assert not torch.equal(lossy, _logits(rm, "fp16", ids, "chunked"))


def test_engine_restores_on_session_steps_at_each_rows_positions(monkeypatch):
    """Rows of prompt lengths 5 and 3, pages of 4 tokens, 6 generated tokens (5 fed): row 0 round-trips at position 8,
    row 1 at 4, each in its own step."""
    rm = tiny_model("tiny-qwen3.5", backend="torch")
    prompts, layers = [[5, 6, 7, 8, 9], [10, 11, 12]], len(rm.layers)
    plain = Engine(rm, "fp32", step="reference", max_batch=2, stop_at_eos=False).generate(prompts, max_gen_toks=6)
    trips = []
    monkeypatch.setattr(session_module, "round_trip", lambda *args: trips.append(args[-1].tolist()) or
                        round_trip(*args))
    same = Engine(rm, "fp32#rt=fp32@every:4", step="reference", max_batch=2, stop_at_eos=False)
    assert [g.tokens for g in same.generate(prompts, max_gen_toks=6)] == [g.tokens for g in plain]
    assert trips == [[False, True]] * layers + [[True, False]] * layers

"""The generation engine: segmented prefill keeps the anchor, continuous batching keeps every row's tokens.

Each prompt generated alone (one row, one prefill call) is the ground truth; the engine runs the
same prompts with two rows at once, prompts fed in 4-token segments, rows of different lengths
leaving and joining the batch, and must give the same tokens per prompt (same seq_ids, so the
same SR bits). Step "graph" (the whole model's step on fixed buffers; new rows take stopped rows' places
where they fit, else the rows regroup into a new decoder, as when most have left) gives the tokens of step
"triton" under the same batching, on each SSM family, and so does step "static" on KDA; both take round trips
at the prompt's end (a prefix-cache hit) and every 3 tokens, each row at its own positions. Then: the order of
entry changes nothing, an
out-of-memory step is recovered by halving the batch (also under step "graph"), and a batch that does not
fit is refused before any work. A decoder's step is launched before the host reads the tokens it takes.
"""

import functools
import gc
import weakref

import pytest
import torch

from replayssm_eval.generate import engine as engine_module, memory
from replayssm_eval.generate.engine import Engine
from replayssm_eval.generate.generation import greedy_generate
from replayssm_eval.models.fixtures import BUNDLED_MODELS
from replayssm_eval.models import session as session_module, static_session
from replayssm_eval.models.model_graph import StaticDecoder

from tests.helpers.device import TEST_DEVICE
from tests.helpers.generation import out_of_memory_at_call, tiny_model

TEXTS = ("ROMEO:\nBut soft, what light through yonder", "KING HENRY:\nOnce more unto the breach, dear friends", "To be",
         "JULIET:\nO Romeo, Romeo", "HAMLET:\nAlas, poor Yorick! I knew him")
LIMITS = [5, 2, 7, 3, 4]  # rows stop at different steps: places free up and waiting prompts join
STEP = "triton" if TEST_DEVICE == "cuda" else "reference"


def prompts(rm, texts=TEXTS):
    return [rm.tokenizer.encode(t) for t in texts]


@functools.cache
def alone(name: str, config: str, step: str, count: int = len(TEXTS)):
    rm = tiny_model(name)
    return [greedy_generate(rm, [p], config=config, max_gen_toks=m, step=step, prefill_segment=10**6)[0].tokens
            for p, m in zip(prompts(rm)[:count], LIMITS)]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["fp32", "nvfp4/fp16sr@4", "shared:fp16sr@2"])
@pytest.mark.parametrize("name", BUNDLED_MODELS)
def test_continuous_batching_gives_each_prompt_its_tokens_alone(name, config):
    rm = tiny_model(name)
    gens = greedy_generate(rm, prompts(rm), config=config, max_gen_toks=LIMITS, step=STEP, max_batch=2,
                           prefill_segment=4, prefill_tokens=8)
    assert [g.tokens for g in gens] == alone(name, config, STEP)
    assert [g.gen_tokens for g in gens] == LIMITS  # no stop strings: every row runs to its own limit


def test_continuous_batching_in_the_triton_interpreter():
    rm = tiny_model("tiny-qwen3.5")
    limits = [3, 1, 2]
    gens = Engine(rm, "nvfp4/fp16sr@2", step="triton", max_batch=2, prefill_segment=4, refill=1).generate(
        prompts(rm)[:3], max_gen_toks=limits)
    ref = [greedy_generate(rm, [p], config="nvfp4/fp16sr@2", max_gen_toks=m, step="reference")[0].tokens
           for p, m in zip(prompts(rm)[:3], limits)]
    assert [g.tokens for g in gens] == ref


GRAPH_TEXTS = ("To be", "O Romeo, Romeo", "Alas", "KING HENRY:\nOnce more")
GRAPH_LIMITS = [3, 1, 4, 2]


@pytest.mark.parametrize("name,config", [
    pytest.param("tiny-qwen3.5", "nvfp4/fp16sr@2", marks=pytest.mark.slow),  # split, SR recurrence; GDN
    pytest.param("tiny-nemotron-h", "shared:nvfp4@2", marks=pytest.mark.slow),  # shared; Mamba-2
    pytest.param("tiny-nemotron-h", "nvfp4/fp8sr@2", marks=pytest.mark.slow),
    pytest.param("tiny-kimi-linear", "nvfp4/fp16sr@2", marks=pytest.mark.slow),  # KDA
    # error feedback: the residuals kept in the fixed buffers, moved with joining rows and regrouped ones
    pytest.param("tiny-nemotron-h", "int8:ef=fp32/fp16sr:ef=bf16@2", marks=pytest.mark.slow),
])
def test_graph_step_with_continuous_batching_gives_the_triton_step_tokens(name, config, monkeypatch):
    rm = tiny_model(name)
    rows = prompts(rm, GRAPH_TEXTS)
    decoders = []
    from_session = StaticDecoder.from_session.__func__
    monkeypatch.setattr(StaticDecoder, "from_session", classmethod(
        lambda cls, *args, **kwargs: decoders.append(from_session(cls, *args, **kwargs)) or decoders[-1]))
    graph = Engine(rm, config, step="graph", max_batch=2, prefill_segment=4, refill=1, stop_at_eos=False).generate(
        rows, max_gen_toks=GRAPH_LIMITS)
    # row 1 stops at its first token; row 2 joins row 0; row 0 stops (masked: row 3 waits), row 3 joins row 2;
    # row 3 stops, nothing waits: row 2 moves alone to a smaller decoder
    assert [d.batch for d in decoders] == [1, 2, 2, 1]
    assert [g.tokens for g in graph] == triton_tokens(name, config)
    assert [g.gen_tokens for g in graph] == GRAPH_LIMITS


@pytest.mark.slow
def test_graph_step_is_launched_before_the_host_reads_the_tokens_it_takes(monkeypatch):
    rm = tiny_model("tiny-nemotron-h")
    events = []
    step, values = StaticDecoder.step, engine_module._HostCopy.values
    monkeypatch.setattr(StaticDecoder, "step", lambda decoder, tokens: events.append(f"step{decoder.batch}")
                        or step(decoder, tokens))
    monkeypatch.setattr(engine_module._HostCopy, "values", lambda copy: events.append("read") or values(copy))
    gens = Engine(rm, "nvfp4/fp16sr@2", step="graph", max_batch=2, prefill_segment=4, refill=1,
                  stop_at_eos=False).generate(prompts(rm, GRAPH_TEXTS), max_gen_toks=GRAPH_LIMITS)
    assert [g.gen_tokens for g in gens] == GRAPH_LIMITS
    # decoders of rows [0], [0, 2], [2, 3], [2] (as in the test above): each step is launched before the host reads
    # the tokens it takes; the last decoder's only row takes its last token, so no step follows
    assert events == ["step1", "read", "step2", "read", "step2", "read", "read"]


@functools.cache
def triton_tokens(name: str, config: str, texts: tuple = GRAPH_TEXTS, limits: tuple = tuple(GRAPH_LIMITS)):
    """Step "triton"'s tokens of `texts` under the batching of the graph tests."""
    rm = tiny_model(name)
    gens = Engine(rm, config, step="triton", max_batch=2, prefill_segment=4, refill=1, stop_at_eos=False).generate(
        prompts(rm, texts), max_gen_toks=list(limits))
    return [g.tokens for g in gens]


@pytest.mark.slow
@pytest.mark.parametrize("name,config", [
    ("tiny-qwen3.5", "nvfp4/fp16sr@2#rt=int8:axis=headdim@every:3"),  # GDN; round trips inside the decode
    ("tiny-nemotron-h", "shared:nvfp4@2"),  # Mamba-2, one stored copy
    ("tiny-kimi-linear", "nvfp4/fp16sr@2"),  # KDA
])
def test_graph_step_puts_new_rows_into_stopped_places(name, config, monkeypatch):
    """A new row whose tokens fit left of the next column joins the running decoder in a stopped row's place (no row
    moves, no new decoder); a row whose budget outlasts the decoder's columns moves to a new one when they run out.
    Every row gets step "triton"'s tokens under the same batching."""
    rm = tiny_model(name)
    decoders = []
    from_session = StaticDecoder.from_session.__func__
    monkeypatch.setattr(StaticDecoder, "from_session", classmethod(
        lambda cls, *args, **kwargs: decoders.append(from_session(cls, *args, **kwargs)) or decoders[-1]))
    engine = Engine(rm, config, step="graph", max_batch=2, prefill_segment=4, refill=1, stop_at_eos=False)
    graph = engine.generate(prompts(rm), max_gen_toks=LIMITS)
    # byte-level prompts of 42, 51, 5, 22 and 37 tokens: rows 0 and 1 share a decoder of 52 + 4 columns; row 2 (6
    # columns after its first step) takes row 1's place, row 3 (23) row 0's; the columns run out under rows 2 and 3,
    # which move to a decoder of their own; row 4 (38 columns) is wider than its 25 written: a new decoder, then
    # row 2 alone
    assert engine.admitted == 2
    assert [(d.batch, d.max_len) for d in decoders] == [(2, 56), (2, 26), (2, 41), (1, 41)]
    assert [g.tokens for g in graph] == triton_tokens(name, config, TEXTS, tuple(LIMITS))
    assert [g.gen_tokens for g in graph] == LIMITS


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "tiny-nemotron-h" else pytest.mark.slow)
                                  for n in BUNDLED_MODELS])  # one model in the quick tier
def test_segmented_prefill_keeps_the_anchor_state(name):
    rm = tiny_model(name)
    rows = prompts(rm)[:3]
    whole, logits_whole = Engine(rm, "fp32", step=STEP, max_batch=3, prefill_segment=10**6).prefill(rows, [0, 1, 2])
    split, logits_split = Engine(rm, "fp32", step=STEP, max_batch=3, prefill_segment=4, prefill_tokens=8).prefill(rows, [0, 1, 2])
    compared = 0
    for a, b in zip(whole.cache.layers, split.cache.layers):
        for attr in ("recurrent_states", "conv_states"):  # conv inputs come from matmuls of other batch shapes: noise
            for k, t in (getattr(a, attr, None) or {}).items():
                torch.testing.assert_close(getattr(b, attr)[k], t, rtol=1e-3, atol=1e-5)
                compared += 1
        if getattr(a, "keys", None) is not None:  # KV [B, H, T, D]: each row's real tokens (the paddings differ)
            for i in range(len(rows)):
                real_a, real_b = whole.attention_mask[i].bool(), split.attention_mask[i].bool()
                torch.testing.assert_close(b.keys[i][:, real_b], a.keys[i][:, real_a], rtol=1e-3, atol=1e-5)
                torch.testing.assert_close(b.values[i][:, real_b], a.values[i][:, real_a], rtol=1e-3, atol=1e-5)
    assert compared >= 4 and not split.states and not whole.states
    torch.testing.assert_close(logits_split, logits_whole, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # 45 s in the interpreter
def test_entry_order_changes_no_tokens():
    rm = tiny_model("tiny-nemotron-h")
    gens = greedy_generate(rm, prompts(rm), config="nvfp4/fp16sr@4", max_gen_toks=LIMITS, step=STEP, max_batch=2,
                           prefill_segment=4, order=[2, 0, 4, 1, 3])
    assert [g.tokens for g in gens] == alone("tiny-nemotron-h", "nvfp4/fp16sr@4", STEP)


@pytest.mark.slow  # CI time
def test_out_of_memory_in_a_step_halves_the_batch_and_regenerates_the_same_tokens(monkeypatch):
    rm = tiny_model("tiny-nemotron-h")
    engine = Engine(rm, "nvfp4/fp16sr@4", step=STEP, max_batch=4, prefill_segment=4)
    calls = out_of_memory_at_call(monkeypatch, engine, 3)
    gens = engine.generate(prompts(rm), max_gen_toks=LIMITS)
    assert engine.max_batch == 2 and max(calls[3:]) <= 2
    assert [g.tokens for g in gens] == alone("tiny-nemotron-h", "nvfp4/fp16sr@4", STEP)


def test_sessions_let_go_are_freed_before_the_next_step(monkeypatch):
    """A session and its HF cache point at each other, so only the cyclic GC frees them: the engine collects
    after a join and after an out-of-memory error, before the next batch needs that memory (GC off here)."""
    rm = tiny_model("tiny-nemotron-h")
    engine = Engine(rm, "nvfp4/fp16sr@4", step=STEP, max_batch=2, prefill_segment=4, refill=1)
    step, seen, alive, calls = engine.step_tokens, [], [], []

    def tracked(session, tokens):
        alive.append(sum(r() is not None and r() is not session for r in seen))
        if not any(r() is session for r in seen):
            seen.append(weakref.ref(session))
        calls.append(tokens.shape[0])
        if len(calls) == 4:
            raise torch.OutOfMemoryError("CUDA out of memory (mocked)")
        return step(session, tokens)

    monkeypatch.setattr(engine, "step_tokens", tracked)
    gc.collect()
    gc.disable()
    try:
        gens = engine.generate(prompts(rm), max_gen_toks=LIMITS)
    finally:
        gc.enable()
    # a new batch's first step runs beside the running batch: at most one other session is alive at a step
    assert len(seen) > 4 and max(alive) == 1
    assert [g.tokens for g in gens] == alone("tiny-nemotron-h", "nvfp4/fp16sr@4", STEP)


@pytest.mark.slow
def test_out_of_memory_under_the_graph_step_regenerates_the_same_tokens(monkeypatch):
    rm = tiny_model("tiny-qwen3.5")
    engine = Engine(rm, "nvfp4/fp16sr@2", step="graph", max_batch=2, prefill_segment=4, refill=1, stop_at_eos=False)
    calls = out_of_memory_at_call(monkeypatch, engine, 4)  # the first step of a two-row decoder (rows 0, 2)
    gens = engine.generate(prompts(rm, GRAPH_TEXTS), max_gen_toks=GRAPH_LIMITS)
    assert calls[3] == 2 and engine.max_batch == 1 and max(calls[4:]) == 1
    assert [g.tokens for g in gens] == triton_tokens("tiny-qwen3.5", "nvfp4/fp16sr@2")


def test_a_batch_that_does_not_fit_is_refused_before_any_work_naming_the_size_and_the_memory():
    cost = memory.RowCost(fixed=2**30, per_token=2**20, logits=2**20, prefill=4 * 2**30)
    with pytest.raises(MemoryError, match=r"batch size 64 needs 1028\.00 GiB \(16\.00 GiB per row.* 80\.00 GiB free.* at most 4 rows fit"):
        memory.fit_batch(64, cost, 15 * 1024 - 1, 80 * 2**30, default=8)
    assert memory.fit_batch("auto", cost, 15 * 1024 - 1, 80 * 2**30, default=8) == 4  # (0.85 * 80 - 4) // 16 GiB
    assert memory.fit_batch("auto", cost, 1000, None, default=8) == 8  # cpu: the default, nothing queried
    with pytest.raises(MemoryError, match="not even one row fits"):
        memory.fit_batch("auto", cost, 1000, 2**30, default=8)


@pytest.mark.slow
def test_static_step_on_kda_gives_the_triton_step_tokens():
    rm = tiny_model("tiny-kimi-linear")
    static = Engine(rm, "shared:fp8sr@2", step="static", max_batch=2, prefill_segment=4, refill=1,
                    stop_at_eos=False).generate(prompts(rm, GRAPH_TEXTS), max_gen_toks=GRAPH_LIMITS)
    assert [g.tokens for g in static] == triton_tokens("tiny-kimi-linear", "shared:fp8sr@2")
    assert [g.gen_tokens for g in static] == GRAPH_LIMITS


# (points, max_gen_toks, rows round-tripped through `kernels.round_trip.round_trip` per step kind and SSM layer): at the
# prompt's end rows 0, 2 and 3 (row 1 stops at its first token); every 3 tokens rows 0 and 2 (prompts of 5 and 4
# tokens) at position 6, inside the fixed buffers, and row 3 (21 tokens) at its first decode step, from the anchor
@pytest.mark.slow
@pytest.mark.parametrize("points, limits, trips_per_layer", [
    ("prompt", GRAPH_LIMITS, {"triton": 3, "static": 3, "graph": 3}),
    ("every:3", [4, 1, 5, 3], {"triton": 3, "static": 1, "graph": 1}),
])
def test_fixed_buffer_steps_take_round_trips_as_the_triton_step(monkeypatch, points, limits, trips_per_layer):
    """Round trips under continuous batching, rows joining at different steps, each at its own positions: a
    prefix-cache hit (`@prompt`) before a row's state enters the fixed buffers, pages (`@every:3`) also inside them.
    Step "static" gives step "triton"'s logits at every step bit for bit, step "graph" its tokens."""
    config = f"nvfp4/fp16sr@2#rt=int8:axis=headdim@{points}"
    rm = tiny_model("tiny-qwen3.5")
    trips = []
    for module in (session_module, static_session):
        monkeypatch.setattr(module, "round_trip", functools.partial(_counted, trips, module.round_trip))

    def run(step):
        engine = Engine(rm, config, step=step, max_batch=2, prefill_segment=4, refill=1, stop_at_eos=False)
        logits, step_tokens = [], engine.step_tokens
        monkeypatch.setattr(engine, "step_tokens", lambda session, t: logits.append(step_tokens(session, t)) or logits[-1])
        trips.clear()
        gens = engine.generate(prompts(rm, GRAPH_TEXTS), max_gen_toks=limits)
        assert sum(trips) == trips_per_layer[step] * len(rm.layers)
        return [g.tokens for g in gens], logits

    tokens, logits = run("triton")
    static_tokens, static_logits = run("static")
    assert static_tokens == tokens and len(static_logits) == len(logits)
    assert all(torch.equal(a, b) for a, b in zip(static_logits, logits))
    assert run("graph")[0] == tokens


def _counted(trips: list, round_trip, *args):
    """`kernels.round_trip.round_trip` that adds the number of rows it round-trips to `trips`."""
    trips.append(int(args[-1].sum()))
    return round_trip(*args)


def test_lm_model_takes_the_decode_step_and_refuses_configs_the_graph_step_cannot_run():
    pytest.importorskip("lm_eval")
    from replayssm_eval.accuracy.lm_model import ReplaySSMLM

    assert ReplaySSMLM(pretrained="tiny-qwen3.5", device="cpu", step="graph").step == "graph"
    assert ReplaySSMLM(pretrained="tiny-qwen3.5", device="cpu").step == "reference"  # auto, on cpu
    with pytest.raises(ValueError, match="step must be auto or one of reference, triton, static, graph, got 'fast'"):
        ReplaySSMLM(pretrained="tiny-qwen3.5", device="cpu", step="fast")
    with pytest.raises(ValueError, match="step 'graph' covers fixed windows only"):
        ReplaySSMLM(pretrained="tiny-qwen3.5", device="cpu", step="graph", config="nvfp4/fp16sr#spec=4:0.5")
    with pytest.raises(ValueError, match=r"step 'graph' takes one config for every layer, got mixed config "
                                         r"'nvfp4/fp16sr\+1=fp32'; use step triton"):
        ReplaySSMLM(pretrained="tiny-qwen3.5", device="cpu", step="graph", config="nvfp4/fp16sr+1=fp32")
    for points in ("prompt", "at:9"):
        tripped = ReplaySSMLM(pretrained="tiny-qwen3.5", device="cpu", step="graph", config=f"nvfp4/fp16sr#rt=int8@{points}")
        assert tripped.step == "graph"


def test_lm_model_checks_the_batch_against_a_mocked_free_memory(monkeypatch):
    pytest.importorskip("lm_eval")
    from replayssm_eval.accuracy.lm_model import ReplaySSMLM

    lm = ReplaySSMLM(pretrained="tiny-nemotron-h", batch_size=64, device="cpu")
    rm_prompts = prompts(lm.rm)
    cost = memory.measure(lm.rm, lm.config, step=lm.step, prefill_segment=lm.prefill_segment,
                          prefill_tokens=lm.prefill_tokens)
    assert cost.fixed > 0 and cost.per_token > 0 and cost.logits == 8 * lm.rm.model.config.vocab_size
    row = cost.row(max(map(len, rm_prompts)) + 16)
    monkeypatch.setattr("replayssm_eval.generate.memory.free_memory", lambda device: int(3.5 * row / (1 - memory.MARGIN)))
    with pytest.raises(MemoryError, match="batch size 64 needs"):
        lm.rows(rm_prompts, [16] * len(rm_prompts))
    lm.batch_size = "auto"
    assert lm.rows(rm_prompts, [16] * len(rm_prompts)) == 3

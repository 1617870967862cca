"""Where an Engine's graph-step decoding waits on the host: an Engine's first call against a later one.

    python benchmarks/engine_syncs.py --out OUT                          # needs a GPU: Qwen3.5-4B, batch 256
    python benchmarks/engine_syncs.py --out OUT --configs fp32 --batch 64

For each config, one `Engine(step="graph")` on the random-weight full-size model runs a 2-row warm-up (its batch
size's compiles only), then "first": a call of `--new-tokens` tokens (the full batch's compiles in it), then a `--first-tokens` call, then "later": `--new-tokens` again, all on
batches of `--batch` rows of `--prompt-len`-token prompts. Per timed call: its wall seconds, and per decoder step
variant the host milliseconds inside `StaticDecoder.step` and inside its CUDA graph's `replay` (the device runs on
while the host launches; a launch that takes as long as a step waited for the device), and every host
synchronization inside `StaticDecoder.step` (`torch.cuda.set_sync_debug_mode`), by the innermost source line of this
package or transformers (`find_syncs.source_of`). Prints a table and writes OUT/engine_syncs.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from find_syncs import source_of  # noqa: E402
from generation import build, random_prompts, release  # noqa: E402

from replayssm_eval.generate.engine import Engine  # noqa: E402
from replayssm_eval.models.model_graph import StaticDecoder  # noqa: E402


class StepProbe:
    """Host time of each `StaticDecoder.step` and of the graph replays inside it, by step variant, and the host syncs
    inside it (while `recording`)."""

    def __init__(self):
        self.recording = False
        self.step_s, self.replay_s = collections.defaultdict(list), collections.defaultdict(list)
        self.syncs = collections.Counter()
        self._variant = None
        step, replay = StaticDecoder.step, torch.cuda.CUDAGraph.replay

        def timed_step(decoder, tokens):
            self._variant = "/".join(map(str, decoder._variant_next()))
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = self._note
                torch.cuda.set_sync_debug_mode("warn" if self.recording else "default")
                try:
                    logits = step(decoder, tokens)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            if self.recording:
                self.step_s[self._variant].append(time.perf_counter() - start)
            return logits

        def timed_replay(graph):
            start = time.perf_counter()
            replay(graph)
            if self.recording:
                self.replay_s[self._variant].append(time.perf_counter() - start)

        StaticDecoder.step, torch.cuda.CUDAGraph.replay = timed_step, timed_replay

    def _note(self, message, category, filename, lineno, file=None, line=None):
        if self.recording:
            self.syncs[source_of(traceback.extract_stack()[:-1])] += 1

    def take(self) -> dict:
        ms = lambda d: {k: [len(v), round(1e3 * sum(v) / len(v), 3)] for k, v in d.items()}  # noqa: E731
        out = {"step_ms": ms(self.step_s), "replay_ms": ms(self.replay_s), "syncs": dict(self.syncs.most_common())}
        self.step_s.clear(), self.replay_s.clear(), self.syncs.clear()
        return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model", default="qwen3.5-4b")
    parser.add_argument("--configs", default="nvfp4:scale=head/fp16sr,fp32")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--first-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    rm = build(args.model, "cuda")
    prompts = random_prompts(rm, args.batch, args.prompt_len, 1)
    probe, rows = StepProbe(), []
    for config in args.configs.split(","):
        engine = Engine(rm, config, step="graph", max_batch=args.batch, stop_at_eos=False)
        engine.generate(prompts[:2], max_gen_toks=4, seq_ids=[0, 1])  # Triton compiles
        for name, tokens in (("first", args.new_tokens), ("short", args.first_tokens), ("later", args.new_tokens)):
            release("cuda")
            probe.recording = name != "short"
            torch.cuda.synchronize()
            start = time.perf_counter()
            engine.generate(prompts, max_gen_toks=tokens, seq_ids=list(range(args.batch)))
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            if probe.recording:
                rows.append({"config": config, "call": name, "seconds": seconds, **probe.take()})
                print(json.dumps(rows[-1]), flush=True)
        del engine
        release("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_syncs.json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows},
                                                           indent=2))
    for r in rows:
        print(f"{r['config']:28s} {r['call']:6s} {r['seconds']:7.2f} s  step ms {r['step_ms']}  replay ms "
              f"{r['replay_ms']}  syncs {sum(r['syncs'].values())}")


if __name__ == "__main__":
    main()

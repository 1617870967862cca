"""Where the KL path waits for the GPU: every host synchronization of one teacher-forced call, by source line.

    python benchmarks/find_syncs.py --model tiny-qwen3.5 --config nvfp4/fp16sr     # needs a GPU

Runs a prompt, then two calls of `--tokens` teacher-forced tokens through `ReplayModel.forward`, the second (which
continues every layer's ReplayState, as each segment of a KL run but the first does) with
`torch.cuda.set_sync_debug_mode("warn")`, and counts the synchronizing operations (a read of a device
value on the host, a blocking copy) by the innermost frame of this package that asked for them (or of
transformers, where the model's own code did). A call without syncs lets the host queue the next layers'
launches while the GPU runs; each sync drains the queue.
"""

from __future__ import annotations

import argparse
import collections
import traceback
import warnings

import torch

from replayssm_eval.models import load_model

_OWN = ("replayssm_eval/", "transformers/")


def source_of(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame in this package (else transformers) of a warning's stack."""
    for owner in _OWN:
        for frame in reversed(stack):
            if owner in frame.filename and "/triton/" not in frame.filename and "warnings" not in frame.filename:
                return f"{frame.filename.split(owner)[-1]}:{frame.lineno} {frame.line}"
    return "elsewhere"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen3.5")
    parser.add_argument("--config", default="nvfp4/fp16sr")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=64)
    args = parser.parse_args()
    rm = load_model(args.model, dtype="fp32", device="cuda", backend="triton")
    vocab = rm.model.config.get_text_config().vocab_size
    first, second = args.prompt_len, args.prompt_len + args.tokens
    ids = torch.randint(0, vocab, (1, second + args.tokens), generator=torch.Generator().manual_seed(0)).cuda()

    def first_call():
        session = rm.new_session(args.config, seq_ids=[0], backend="triton")
        rm.forward(ids[:, :first], session, logits_to_keep=1)
        rm.forward(ids[:, first:second], session, logits_to_keep=1)
        return session

    rm.forward(ids[:, second:], first_call(), logits_to_keep=1)  # compiles
    session = first_call()
    torch.cuda.synchronize()
    counts = collections.Counter()

    def note(message, category, filename, lineno, file=None, line=None):
        counts[source_of(traceback.extract_stack()[:-1])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = note  # restored by catch_warnings
        torch.cuda.set_sync_debug_mode("warn")
        try:
            rm.forward(ids[:, second:], session, logits_to_keep=1)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    total = sum(counts.values())
    print(f"{args.model} {args.config}: {total} host syncs in a second call of {args.tokens} tokens")
    for source, n in counts.most_common():
        print(f"{n:5d}  {source}")


if __name__ == "__main__":
    main()

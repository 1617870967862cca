"""The KL path's time per teacher-forced segment, along one long document (needs a GPU).

    python benchmarks/segment_times.py --model nemotron-3-nano-4b --configs fp32,nvfp4/fp16sr --tokens 32768

For each config, two passes over the same tokens (a 512-token prompt, then segments of 2048), each segment timed to
its end (a device sync after it); the second pass's last segment under torch.profiler (its top operators by GPU
time). The first pass also compiles and grows the caching allocator to the document's length; the second shows what
a segment costs at each length once they are done (`full_size.py` times whole passes).
"""

from __future__ import annotations

import argparse
import time

import torch

from full_size import FULL_SIZE, build, sync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=FULL_SIZE[0])
    parser.add_argument("--configs", default="fp32,nvfp4/fp16sr")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--segment", type=int, default=2048)
    args = parser.parse_args()
    rm = build(args.model, "cuda", torch.bfloat16)
    vocab = rm.model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (1, args.prompt_len + args.tokens), generator=torch.Generator().manual_seed(0))
    ids = ids.cuda()
    starts = range(args.prompt_len, ids.shape[1], args.segment)
    for config in args.configs.split(","):
        for attempt in ("first pass", "second pass"):
            session = rm.new_session(config, seq_ids=[0], backend="triton")
            rm.forward(ids[:, :args.prompt_len], session, logits_to_keep=1)
            sync("cuda")
            ms, profile = [], None
            for begin in starts:
                start = time.perf_counter()
                if attempt == "second pass" and begin == starts[-1]:
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                            torch.profiler.ProfilerActivity.CUDA]) as profile:
                        rm.forward(ids[:, begin:begin + args.segment], session, logits_to_keep=1)
                        sync("cuda")
                else:
                    rm.forward(ids[:, begin:begin + args.segment], session, logits_to_keep=1)
                    sync("cuda")
                ms.append(1000 * (time.perf_counter() - start))
            print(f"{config}, {attempt}, ms per segment (the second pass's last one profiled):",
                  " ".join(f"{t:.0f}" for t in ms), flush=True)
        print(profile.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70),
              flush=True)


if __name__ == "__main__":
    main()

"""Save a full-size architecture with random weights as a model folder that every command loads (no download).

    python benchmarks/save_random_model.py --model qwen3.5-4b --out /tmp/models/qwen3.5-4b      # about 8 GB (bf16)
    replayssm-eval sensitivity --model /tmp/models/qwen3.5-4b --tokens 32768 --num-docs 1

The folder holds the model (`presets.full_size_config`, weights drawn from `--seed`, bf16 safetensors)
and the byte-level tokenizer of the bundled fixtures: token ids 0..257 of a vocabulary of 131K-248K,
so any text runs. Random weights are for speed and memory, never for accuracy.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM

from replayssm_eval.models.presets import full_size_config
from replayssm_eval.models.tokenizer import save_byte_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="nemotron-3-nano-4b, qwen3.5-4b or kimi-linear-48b-a3b")
    parser.add_argument("--out", required=True, help="folder to write (created)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(full_size_config(args.model), dtype=torch.bfloat16)
    model.save_pretrained(args.out)
    save_byte_tokenizer(args.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"saved {args.model} ({params / 1e9:.2f}B parameters, random weights, seed {args.seed}) to {args.out} "
          f"in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

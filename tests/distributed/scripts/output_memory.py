"""One rank of the model-output memory test: a causal LM whose logits are most of what a step holds (one layer,
hidden 64, vocab 32000, seq 2048: the logits are 250 MiB, every parameter under 8 MiB), trained by the README's plain
loop with its loss computed in the model, natively or in ORT. Writes `<out>/rank<r>.json`: per step how far RSS rose
above where the step began (VmHWM reset first; run with MALLOC_MMAP_THRESHOLD_ low, so that a freed tensor leaves
RSS), the logits' size and the losses."""

from __future__ import annotations

import argparse
from pathlib import Path

import deepspeed
import torch
from rank_run import finish, start, write_result

VOCAB, SEQ = 32000, 2048


def status_mib(field: str) -> float:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(f"{field}:"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["native", "ort"], required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    rank = start(args.mode)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)  # use_cache at its default: the keys and values are outputs too
    if args.mode == "ort":
        from onnxruntime.training.ortmodule import ORTModule

        model = ORTModule(model)
    ds_config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "steps_per_print": 10**9}  # fmt: skip
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(rank))
    rise_mib, losses = [], []
    for _ in range(args.steps):
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = status_mib("VmRSS")
        outputs = engine(input_ids=ids, labels=ids)
        engine.backward(outputs.loss)
        engine.step()
        losses.append(outputs.loss.item())
        del outputs
        rise_mib.append(status_mib("VmHWM") - before)
    result = {"rise_mib": rise_mib, "losses": losses, "logits_mib": SEQ * VOCAB * 4 / 2**20}
    write_result(args.out, rank, result, engine.module if args.mode == "ort" else None)
    finish()


if __name__ == "__main__":
    main()

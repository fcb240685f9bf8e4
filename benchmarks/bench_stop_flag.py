"""What the agreed stop on SIGTERM costs per optimizer step: the one all-reduce of a flag `ORTZeroTrainer` runs at
every step's end with `enable_jit_checkpoint=True` (ort_zero/integrations/preemption.py), in a real-size run.

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu .venv/bin/python -m torch.distributed.run --nproc_per_node 2 \\
        benchmarks/bench_stop_flag.py --deepspeed ds_configs/zero3_hf_auto.json          # LLaMA 162M, 12 steps

The model and job are bench_real_size.py's 160m (vocab 32000, sequence 128, micro-batch 1, AdamW). Rank 0 prints,
as JSON, per rank: every step's wall time and the time its flag all-reduce took (that includes waiting for the slower
rank, time the step's next collective would otherwise wait), their medians and the ratio; and the all-reduce's
latency alone, 200 calls back to back after training (`idle_ms`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ort_zero  # noqa: F401  (before ORTModule: torch.onnx compatibility)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deepspeed", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, LlamaConfig, TrainerCallback, TrainingArguments, set_seed

    from ort_zero.distributed import init_distributed, shut_down_distributed
    from ort_zero.integrations.hf_trainer import ORTZeroTrainer
    from ort_zero.integrations.preemption import AgreedStopOnSigterm

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.began = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.seconds.append(time.perf_counter() - self.began)

    rank, world_size = init_distributed()
    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="bench_stop_flag_"), per_device_train_batch_size=1, max_steps=args.steps,
        learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to=[], deepspeed=str(args.deepspeed),
        use_cpu=not torch.cuda.is_available(), seed=1234, disable_tqdm=True, enable_jit_checkpoint=True,
    )  # fmt: skip
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        max_position_embeddings=args.seq_len, intermediate_size=args.intermediate,
    )  # fmt: skip
    set_seed(1234)
    model = AutoModelForCausalLM.from_config(config)
    ids = torch.randint(
        0, args.vocab, (args.steps * world_size, args.seq_len), generator=torch.Generator().manual_seed(0)
    )
    dataset = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in ids]
    clock = StepClock()  # first: its on_step_end runs before the flag's, so a step's time leaves the flag out
    trainer = ORTZeroTrainer(model=model, args=training_args, train_dataset=dataset, callbacks=[clock])
    stop = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, AgreedStopOnSigterm))
    flag_seconds: list[float] = []
    agreed = stop.request.agreed

    def timed_agreed() -> bool:
        began = time.perf_counter()
        result = agreed()
        flag_seconds.append(time.perf_counter() - began)
        return result

    stop.request.agreed = timed_agreed  # type: ignore[method-assign]
    trainer.train()
    idle = []
    for _ in range(200):
        began = time.perf_counter()
        agreed()
        idle.append(time.perf_counter() - began)
    steps = clock.seconds[2:]  # from step 3: the first steps export and warm up
    flags = flag_seconds[2:]
    record = {
        "rank": rank,
        "step_s": clock.seconds,
        "flag_ms": [seconds * 1000 for seconds in flag_seconds],
        "median_step_s": statistics.median(steps),
        "median_flag_ms": statistics.median(flags) * 1000,
        "flag_over_step": statistics.median(flags) / statistics.median(steps),
        "idle_ms": {"median": statistics.median(idle) * 1000, "max": max(idle) * 1000},
    }
    records: list[Any] = [None] * world_size
    dist.all_gather_object(records, record)
    if rank == 0:
        print(json.dumps(records, indent=1))
    shut_down_distributed()


if __name__ == "__main__":
    main()

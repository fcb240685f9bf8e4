"""A plain accelerate training loop under `accelerate launch` with the DeepSpeed plugin at ZeRO stage 3, natively or
in ONNX Runtime (--ort: the documented one-line change, ORTZeroAccelerator). The model's config is transformers'
default (use_cache on). A small LLaMA from config on the stdlib corpus; rank 0 writes
<out>/losses.csv (every step's loss averaged over the ranks) and, in ORT, <out>/ort.json.

    accelerate launch --config_file ds_configs/accelerate_zero3_cpu.yaml accelerate_loop.py --out DIR [--ort]

--record DIR records the run (integrations.run_record) on the engine accelerate made.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ort", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--record", type=Path, help="record the run there (integrations.run_record)")
    args = parser.parse_args()

    import torch
    from accelerate import Accelerator, PartialState
    from deepspeed.accelerator import get_accelerator
    from transformers import AutoModelForCausalLM, LlamaConfig

    from ort_zero.data import CorpusWindows, load_corpus
    from ort_zero.distributed import init_distributed, shut_down_distributed
    from ort_zero.examples.rank_run import collective_timeout, configure_threads
    from ort_zero.examples.train_hf import collate

    configure_threads()
    if args.ort:
        from ort_zero.integrations.accelerate import ORTZeroAccelerator as Accelerator  # the one changed line
    elif get_accelerator().device_name() == "cpu":
        # what ORTZeroAccelerator starts itself on CPU, natively: DeepSpeed's process group before zero.Init, and
        # accelerate's CPU state (accelerate's DeepSpeed launch does not pass use_cpu on: it would count one process)
        init_distributed(collective_timeout())
        PartialState(cpu=True)
    accelerator = Accelerator()  # the DeepSpeed plugin from accelerate launch: the model is built under zero.Init
    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, eps=1e-6)
    windows = CorpusWindows(1234, 4 * args.steps * accelerator.num_processes, 32, load_corpus())
    loader = torch.utils.data.DataLoader(windows, batch_size=2, collate_fn=collate)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if args.record is not None:  # the engine accelerate made
        from ort_zero.integrations.run_record import record_engine

        record_engine(model, args.record)
    losses = []
    model.train()
    for _, batch in zip(range(args.steps), loader, strict=False):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    if accelerator.is_main_process:
        args.out.mkdir(parents=True, exist_ok=True)
        rows = "".join(f"{step},{loss!r}\n" for step, loss in enumerate(losses))
        (args.out / "losses.csv").write_text("step,loss\n" + rows)
        if args.ort:
            from ort_zero.ort.inspection import ort_run_record

            (args.out / "ort.json").write_text(json.dumps(ort_run_record(model), indent=1) + "\n")
    shut_down_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())

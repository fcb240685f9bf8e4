"""One process, one rank: a small LLaMA under DeepSpeed ZeRO-3 in an ORTModule, trained two steps; prints, as JSON,
per step and direction the share of the modules with parameters whose parameters were already gathered or being
gathered when their own gather began (prefetched), and the losses. `--no-prefetch`: without the first step's prefetch
from the exported order. Run by tests/unit/zero3/test_exported_order.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from ort_zero.foreign import deepspeed as ds_internals
from ort_zero.ort.inspection import ort_run_record
from ort_zero.zero3 import state as zero3_state
from ort_zero.zero3.exported_order import ExportedOrder

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ort"))  # tests/unit/ort: the scripts' shared setup
from zero3_llama import llama_engine  # noqa: E402


def main() -> None:
    if "--no-prefetch" in sys.argv:
        ExportedOrder.prefetch_from = lambda *args, **kwargs: None
    step = [0]
    seen: dict[str, list[bool]] = {}

    def recording(gather):  # noqa: ANN001, ANN202
        def recorded(self, *args):  # noqa: ANN001, ANN202
            params = ds_internals.fetched_params(self.module)
            if params:
                direction = "forward" if gather.__name__ == "gather_for_forward" else "backward"
                prefetched = all(p.ds_status != ZeroParamStatus.NOT_AVAILABLE for p in params)
                seen.setdefault(f"step{step[0]}_{direction}", []).append(prefetched)
            return gather(self, *args)

        return recorded

    for name in ("gather_for_forward", "gather_for_backward"):
        setattr(zero3_state.ModuleState, name, recording(getattr(zero3_state.ModuleState, name)))
    engine, model, llama = llama_engine(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    )  # fmt: skip
    ids = torch.randint(0, llama.vocab_size, (1, 32))
    losses = []
    for step[0] in (1, 2):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    record = ort_run_record(model)["training"]
    shares = {key: sum(flags) / len(flags) for key, flags in seen.items()}
    print(json.dumps({"prefetched": shares, "losses": losses, "ort_ran": bool(record["session"])}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

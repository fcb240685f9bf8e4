"""One process, one rank: a small LLaMA under DeepSpeed ZeRO-3 in an ORTModule, trained two steps; prints, as JSON,
how many of the forward's MLP activations (torch tensors of the intermediate size) were still alive at each trim
after a backward. Run by tests/unit/memory/test_footprint.py."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch

from ort_zero.memory import footprint
from ort_zero.ort.inspection import ort_run_record

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ort"))  # tests/unit/ort: the scripts' shared setup
from zero3_llama import llama_engine  # noqa: E402

INTERMEDIATE = 1536  # no other tensor of the model ends in this size
AFTER_BACKWARD = ("backward_then_trim", "run_backward_then_trim")


def activations_alive() -> int:
    return sum(isinstance(o, torch.Tensor) and o.dim() == 3 and o.shape[-1] == INTERMEDIATE for o in gc.get_objects())


def main() -> None:
    alive_at_trims: list[int] = []
    trim = footprint.heap.give_back_freed_memory

    def recorded_trim() -> None:
        if sys._getframe(1).f_code.co_name in AFTER_BACKWARD:
            alive_at_trims.append(activations_alive())
        trim()

    footprint.heap.give_back_freed_memory = recorded_trim
    engine, model, llama = llama_engine(
        vocab_size=256, hidden_size=128, intermediate_size=INTERMEDIATE, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=512,
    )  # fmt: skip
    ids = torch.randint(0, llama.vocab_size, (1, 512))
    for _ in range(2):
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    record = ort_run_record(model)["training"]
    print(json.dumps({"alive_at_backward_trims": alive_at_trims, "ort_ran": bool(record["session"])}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

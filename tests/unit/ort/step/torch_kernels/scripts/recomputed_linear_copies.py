"""One process, one rank: a small ZeRO-3 LLaMA in an ORTModule under the layer-wise recompute
(ORTMODULE_MEMORY_OPT_LEVEL=1), trained two steps; prints, as JSON, how many input copies the linear layers made in
the second step's forward and in its backward (the recompute), the two losses, and what ORT ran and recomputed. Run by
tests/unit/ort/step/torch_kernels/test_linear.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ort_zero.ort.inspection import ort_run_record
from ort_zero.ort.step.torch_kernels import linear

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # tests/unit/ort: the scripts' shared setup
from zero3_llama import llama_engine  # noqa: E402


class CountedCopies:
    """Counts the copies `LinearInTorch` keeps for its weight's gradient (made or shared)."""

    def __init__(self) -> None:
        self.count = 0
        self.made = linear._SharedCopy.of.__func__

    def __call__(self, cls: type, input: torch.Tensor) -> torch.Tensor:
        self.count += 1
        return self.made(cls, input)


def main() -> None:
    engine, model, llama = llama_engine(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=128,
    )  # fmt: skip
    counted = CountedCopies()
    linear._SharedCopy.of = classmethod(counted)
    ids = torch.randint(0, llama.vocab_size, (1, 64))
    losses, copies = [], {}
    for _ in range(2):
        counted.count = 0
        loss = engine(input_ids=ids, labels=ids).loss
        copies["forward"] = counted.count
        engine.backward(loss)
        copies["backward"] = counted.count - copies["forward"]
        engine.step()
        losses.append(loss.item())
    record = ort_run_record(model)["training"]
    print(json.dumps({"copies": copies, "losses": losses, "ort_ran": bool(record["session"]), **record}, default=str))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

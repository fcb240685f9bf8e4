"""One process: a small LLaMA whose linear layers, attention and loss run as torch's kernels (PythonOps) in an
ORTModule trained twice; prints, as JSON, RSS and the heap's live bytes right after ORT's first and second forward, and
how far RSS fell in the trim after the first forward (`first_trim_mib`, measured around it in this process). Run
by tests/unit/ort/ortmodule/test_footprint.py with and without ORT_ZERO_TRIM_HEAP, and with `--checked` (the kernels run
with ORT's safety copies)."""

from __future__ import annotations

import importlib
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import ort_zero  # noqa: F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero import patches
from ort_zero.memory import footprint
from ort_zero.ort.inspection import ort_run_record
from ort_zero.ort.passes import unchecked_kernels


def heap() -> dict[str, float]:
    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"rss_mib": rss / 2**20, "live_mib": footprint.malloced_bytes() / 2**20}


def main() -> None:
    os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
    if "--checked" in sys.argv:  # ORT runs the kernels with its safety copies, as before passes.unchecked_kernels
        unchecked_kernels.UNCHECKED = frozenset()
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=4,
        max_position_embeddings=1024,
    )  # fmt: skip
    model = ortmodule.ORTModule(LlamaForCausalLM(config))
    ids = torch.randint(0, config.vocab_size, (2, 1024))
    after_forward = []
    trimmed_by: list[float] = []
    trim = footprint.heap.give_back_freed_memory

    def measured_trim() -> None:
        before = heap()["rss_mib"]
        trim()
        if sys._getframe(1).f_code.co_name == "run_forward_then_trim":
            trimmed_by.append(before - heap()["rss_mib"])

    footprint.heap.give_back_freed_memory = measured_trim
    ort_zero.enable_zero3()
    with patches.applied("torch_kernels"):
        for _ in range(2):
            loss = model(input_ids=ids, labels=ids).loss
            after_forward.append(heap())
            loss.backward()
    record = ort_run_record(model)["training"]
    first, second = after_forward
    print(
        json.dumps(
            {
                **first,
                "second_rss_mib": second["rss_mib"],
                "second_live_mib": second["live_mib"],
                "first_trim_mib": trimmed_by[0] if trimmed_by else 0.0,  # 0: no trim after the forward
                "ort_ran": bool(record["session"]),
                "python_ops": record["python_ops"],
            }
        )
    )


if __name__ == "__main__":
    main()

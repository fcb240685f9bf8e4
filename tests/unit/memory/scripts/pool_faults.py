"""One process: a small LLaMA whose linear layers run as torch's matmuls (PythonOps) in an ORTModule, trained
three steps (SGD) at seq 1024 in the dtype its argument names (float32 or bfloat16); prints, as JSON, the losses, the
page faults of the third forward, the pages of a forward's linear outputs and the highest RSS seen at the ends of the
later forwards and backwards. Run by tests/unit/memory/test_output_pool.py with and without
ORT_ZERO_OUTPUT_POOL."""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import ort_zero  # noqa: F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero import patches
from ort_zero.ort.inspection import ort_run_record


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=1024,
    )  # fmt: skip
    dtype = getattr(torch, sys.argv[1])
    model = ortmodule.ORTModule(LlamaForCausalLM(config).to(dtype))
    ids = torch.randint(0, config.vocab_size, (2, 1024))
    linear_outputs = sum(m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)) * ids.numel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, forward_faults, rss = [], 0, []
    ort_zero.enable_zero3()
    with patches.applied("torch_kernels"):
        for _ in range(3):
            before = faults()
            loss = model(input_ids=ids, labels=ids).loss
            forward_faults = faults() - before
            rss.append(rss_mib())
            loss.backward()
            rss.append(rss_mib())
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    record = ort_run_record(model)["training"]
    print(
        json.dumps(
            {
                "losses": losses,
                "forward_faults": forward_faults,
                "linear_output_pages": linear_outputs * dtype.itemsize // os.sysconf("SC_PAGE_SIZE"),
                "peak_rss_mib": max(rss[2:]),
                "ort_ran": bool(record["session"]),
                "python_ops": record["python_ops"],
            }
        )
    )


if __name__ == "__main__":
    main()

"""One process, one rank: a small LLaMA under DeepSpeed ZeRO-3 in an ORTModule, trained one step; prints, as JSON,
the forward values of [batch, heads, seq, head size] ORT's training graph keeps for the backward (the query and key
ORT kept for a gradient of the rotary cos and sin nobody needs), the loss, and whether ORT ran. Run by
tests/unit/ort/passes/test_gradient_free_bypass.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ort_zero.foreign import onnxruntime as ort_internals
from ort_zero.ort.graph.training_graph import TrainingGraphView
from ort_zero.ort.inspection import ort_run_record

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/unit/ort: the scripts' shared setup
from zero3_llama import llama_engine  # noqa: E402

HEADS, HEAD_SIZE = 4, 32


def kept_head_tensors(model: torch.nn.Module) -> list[str]:
    graph = ort_internals.optimized_model(ort_internals.execution_manager(model, training=True)).graph
    ranks = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.value_info, *graph.output]
    }
    view = TrainingGraphView(graph)
    return [
        f"{view.nodes[i].op_type} {out}"
        for i in view.forward
        for out in view.nodes[i].output
        if out
        and any(c in view.backward_set for c in view.consumers.get(out, ()))
        and len(dims := ranks.get(out, [])) == 4
        and dims[1] == HEADS
        and dims[3] == HEAD_SIZE
    ]


def main() -> None:
    engine, model, llama = llama_engine(
        vocab_size=256, hidden_size=HEADS * HEAD_SIZE, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=HEADS, max_position_embeddings=256,
    )  # fmt: skip
    ids = torch.randint(0, llama.vocab_size, (1, 128))
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    record = ort_run_record(model)["training"]
    print(json.dumps({"kept": kept_head_tensors(model), "loss": float(loss), "ort_ran": bool(record["session"])}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

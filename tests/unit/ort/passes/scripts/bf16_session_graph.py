"""One process, one rank: a small Gemma in bf16 under DeepSpeed ZeRO-3 in an ORTModule, trained one step; prints, as
JSON, the float32 copies of forward values that the graph ORT's session really runs (after its own optimizations,
saved through `SessionOptions.optimized_model_filepath`) keeps for the backward, the loss, and whether ORT ran. Run
by tests/unit/ort/passes/test_half_precision_casts.py."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/unit/ort: the scripts' shared setup
import zero3_llama  # noqa: E402

from ort_zero.ort.graph.training_graph import TrainingGraphView  # noqa: E402
from ort_zero.ort.inspection import ort_run_record  # noqa: E402

SAVED = Path(tempfile.mkdtemp()) / "session_graph.onnx"


def saving_the_session_graph() -> None:
    """Every session's graph, as ORT optimized it, written to SAVED (ORT's own session option)."""
    from onnxruntime.training.ortmodule._graph_execution_manager import GraphExecutionManager

    configured = GraphExecutionManager._get_session_config

    def _get_session_config(self):  # noqa: ANN001, ANN202
        session_options, providers, provider_options = configured(self)
        session_options.optimized_model_filepath = str(SAVED)
        return session_options, providers, provider_options

    GraphExecutionManager._get_session_config = _get_session_config


def float32_copies_kept(graph: onnx.GraphProto) -> list[str]:
    """Casts to float32 of 16-bit forward values whose output a backward node reads (the copy lives until then)."""
    view = TrainingGraphView(graph)
    return [
        view.nodes[i].name
        for i in view.forward
        if view.nodes[i].op_type == "Cast"
        and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in view.nodes[i].attribute)
        and "widen_input" in view.nodes[i].name
        and any(c in view.backward_set for c in view.consumers.get(view.nodes[i].output[0], ()))
    ]


def main() -> None:
    zero3_llama.CONFIG["bf16"] = {"enabled": True}
    # Gemma: its norms (`1 + weight`) and GELU are ORT's, widened, where a LLaMA's now run in torch in bf16
    engine, model, llama = zero3_llama.llama_engine(
        "gemma", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
    )  # fmt: skip
    saving_the_session_graph()
    ids = torch.randint(0, llama.vocab_size, (1, 64))
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    record = ort_run_record(model)["training"]
    graph = onnx.load(str(SAVED)).graph
    print(json.dumps({
        "kept": float32_copies_kept(graph), "widened": record["float32_fallbacks"], "loss": float(loss),
        "ort_ran": bool(record["session"]), "dtype": str(next(model.parameters()).dtype),
    }))  # fmt: skip
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

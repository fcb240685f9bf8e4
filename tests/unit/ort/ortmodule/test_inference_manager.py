"""ORTModule's inference graph (a `torch.no_grad()` forward) of a bf16 LLaMA (ort_zero/ort/ortmodule/
inference_manager.py): ORT's graph builder fuses no Split there, its rotary halves stay bf16 Slices, the 16-bit
kernels leave no node computing in float32, and its logits are PyTorch's."""

from __future__ import annotations

import contextlib
import importlib

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ort_zero import patches
from ort_zero.foreign import onnxruntime as ort_internals
from ort_zero.ort.inspection import ort_run_record


def test_a_bf16_llamas_inference_graph_has_no_float32_node(enabled: None) -> None:
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    config = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = LlamaForCausalLM._from_config(config, attn_implementation="sdpa").to(torch.bfloat16).eval()
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa").to(torch.bfloat16).eval()
    model.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 96, (2, 24))
    in_ort = ortmodule.ORTModule(model)
    with torch.no_grad(), contextlib.ExitStack() as stack:
        stack.enter_context(patches.applied("torch_kernels"))
        got = in_ort(input_ids=ids).logits
        expected = reference(input_ids=ids).logits
    record = ort_run_record(in_ort)["inference"]
    assert record["session"], "no ORT inference session: the model did not run in ORT"
    graph = ort_internals.optimized_model(ort_internals.execution_manager(in_ort, training=False)).graph
    ops = {node.op_type for node in graph.node}
    assert "Slice" in ops and not {"Split", "SplitTraining"} & ops, ops
    assert record["float32_fallbacks"] == {}, record["float32_fallbacks"]
    torch.testing.assert_close(got.float(), expected.float(), rtol=5e-2, atol=5e-2)  # bf16: a few of its units

"""Linear layers as torch's matmuls in ORT's graph (ort_zero/ort/step/torch_kernels/linear.py): a LLaMA (its
projections, MLP and LM head) trains in ORT with PyTorch's loss and gradients, every nn.Linear one PythonOp, no MatMul
of ORT's reading a weight; a LoRA-frozen base layer gets no weight gradient; the export's trace runs no matmul on a
partitioned weight's stand-in."""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from ort_zero import patches
from ort_zero.foreign import onnxruntime as ort_internals
from ort_zero.hooks.export_mode import is_stand_in
from ort_zero.memory.output_pool import POOL
from ort_zero.ort.export.context import stood_in_for_export
from ort_zero.ort.inspection import ort_run_record
from ort_zero.ort.step.torch_kernels import LinearInTorch
from ort_zero.python_op import function_name, function_name_of

KERNEL = function_name(LinearInTorch)
ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
TrainStep = Callable[..., dict]
LlamaMaker = Callable[..., LlamaForCausalLM]
LAYERS = 2


def test_every_linear_runs_in_torch(train_step: TrainStep, tiny_llama: LlamaMaker) -> None:
    result = train_step(lambda: tiny_llama(layers=LAYERS), ("torch_kernels",))
    graph = ort_internals.optimized_model(ort_internals.execution_manager(result["model"], training=True)).graph
    kernels = [node for node in graph.node if function_name_of(node) == KERNEL]
    assert len(kernels) == 7 * LAYERS + 1  # q, k, v, o, gate, up, down per layer; the LM head
    weights = {init.name for init in graph.initializer} | {i.name for i in graph.input if "weight" in i.name}
    assert not [node.name for node in graph.node if node.op_type == "MatMul" and set(node.input) & weights]


def test_a_frozen_linear_gets_no_weight_gradient(train_step: TrainStep, tiny_llama: LlamaMaker) -> None:
    def frozen_projections() -> LlamaForCausalLM:
        model = tiny_llama(layers=LAYERS)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.requires_grad_(False)
        return model

    result = train_step(frozen_projections, ("torch_kernels",))  # the same gradients: none for the frozen weights
    assert KERNEL in result["record"]["python_ops"]


def _kept_inputs() -> list[torch.Tensor]:
    """The input copies the live LinearInTorch contexts (torch's or ORT's plain ones) keep for their backward."""
    kept = []
    for obj in gc.get_objects():
        attributes = getattr(type(obj), "__dictoffset__", 0) and vars(obj)
        if attributes and isinstance(attributes.get("linear"), torch.nn.Linear):
            kept.append(attributes.get("input"))
    return [t for t in kept if isinstance(t, torch.Tensor)]


def test_linears_reading_the_same_input_keep_one_copy(train_step: TrainStep, tiny_llama: LlamaMaker) -> None:
    model = train_step(lambda: tiny_llama(layers=LAYERS), ("torch_kernels",))["model"]
    ids = torch.randint(0, 96, (2, 24))
    with patches.applied("torch_kernels"):
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
        kept = _kept_inputs()
        loss.backward()
    # per layer: q, k, v share one copy, o its own, gate and up share one, down its own; and the LM head's
    assert len(kept) == 7 * LAYERS + 1
    assert len({t.data_ptr() for t in kept}) == 4 * LAYERS + 1


def test_the_kept_copies_are_written_into_the_output_pool(train_step: TrainStep, tiny_llama: LlamaMaker) -> None:
    """Not into fresh memory, whose pages a large copy faults in again every step."""
    model = train_step(lambda: tiny_llama(layers=LAYERS), ("torch_kernels",))["model"]
    ids = torch.randint(0, 96, (2, 24))
    with patches.applied("torch_kernels"):
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
        kept = {t.untyped_storage().data_ptr() for t in _kept_inputs()}
        pool = {b.tensor.untyped_storage().data_ptr() for buffers in POOL.buffers.values() for b in buffers}
        loss.backward()
    assert len(kept) == 4 * LAYERS + 1
    assert kept <= pool


class ScaledHead(torch.nn.Linear):
    """A linear layer with a parameter of its own applied after `F.linear` (as Dory's LM head scales its logits)."""

    def __init__(self) -> None:
        super().__init__(8, 6, bias=False)
        self.logit_scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.logit_scale


class WithScaledHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = ScaledHead()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x).square().mean()


def test_a_subclass_parameter_is_not_the_kernels(enabled: None) -> None:
    torch.manual_seed(0)
    reference, model = WithScaledHead(), WithScaledHead()
    model.load_state_dict(reference.state_dict())
    x = torch.randn(4, 8)
    reference(x).backward()  # in PyTorch, before the kernels' patch
    in_ort = ortmodule.ORTModule(model)
    with patches.applied("torch_kernels"):
        in_ort(x).backward()
    assert KERNEL in ort_run_record(in_ort)["training"]["python_ops"]
    for got, expected in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-4, atol=1e-6)


def test_the_trace_runs_no_matmul_on_a_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a ZeRO-3 model is exported its partitioned weights are zeros: the layer's output is its bias, made
    without the matmul (torch's linear is asked only for the output's dtype, over no rows)."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    linear = torch.nn.Linear(8, 6)
    with torch.no_grad():
        linear.bias.copy_(torch.arange(6.0))
    weight = linear.weight
    weight.ds_status, weight.ds_numel, weight.ds_shape = ZeroParamStatus.NOT_AVAILABLE, 48, torch.Size([6, 8])
    rows: list[int] = []
    real_linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, *a: rows.append(x.shape[0]) or real_linear(x, *a))
    x = torch.randn(3, 5, 8)
    with stood_in_for_export(linear):
        assert is_stand_in(weight)
        traced = LinearInTorch.apply(x, linear, weight, linear.bias)
    assert rows == [0]
    torch.testing.assert_close(traced, torch.arange(6.0).expand(3, 5, 6))
    computed = LinearInTorch.apply(x, linear, weight, linear.bias)  # not exporting: torch's matmul
    torch.testing.assert_close(computed, x @ weight.detach().t() + linear.bias.detach())


RECOMPUTED_COPIES = Path(__file__).parent / "scripts" / "recomputed_linear_copies.py"


def test_a_recomputed_layers_forward_keeps_no_input_copy() -> None:
    """Under the layer-wise recompute the backward reads the copies each layer's linears make in their recomputed
    call; the forward's calls made them too (7 per LLaMA layer; 55-61 ms for a [2048, 3072] input), for nothing.
    Now the forward makes only the LM head's, outside the layers (losses: tests/distributed/test_recompute.py)."""
    env = {**os.environ, "ORTMODULE_MEMORY_OPT_LEVEL": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(RECOMPUTED_COPIES)], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run["ort_ran"] and KERNEL in run["python_ops"], run
    assert run["recompute"]["recomputed_python_ops"][KERNEL] == 7 * LAYERS, run["recompute"]
    assert run["copies"] == {"forward": 1, "backward": 7 * LAYERS}, run["copies"]
    assert run["losses"][1] < run["losses"][0], run["losses"]

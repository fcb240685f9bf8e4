"""StatisticsSubscriber under ORTModule: recorder PythonOps give the same dumps as the PyTorch run, step by step."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

import pytest
import torch

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.hooks import SubscriberManager  # noqa: E402
from ort_zero.hooks.statistics import EndStep, RecordStatistics, StatisticsSubscriber, inspect_activation  # noqa: E402
from ort_zero.ort.graph.edit import python_ops  # noqa: E402
from ort_zero.python_op import function_name  # noqa: E402
from ort_zero.tools import compare_runs, load_run  # noqa: E402

STEPS = 3


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(2))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.embed(x))
        for block in self.blocks:
            hidden = inspect_activation("residual", hidden + torch.relu(block(hidden)))
        return torch.nn.functional.cross_entropy(self.head(hidden), target)


def train(model: torch.nn.Module, run: Path, **window: int) -> torch.nn.Module:
    """Subscribe statistics to the plain model, optionally wrap it in ORTModule, and train a few SGD steps."""
    SubscriberManager().subscribe(model, [StatisticsSubscriber(run, **window)])
    if run.name == "ort":
        model = ortmodule.ORTModule(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(step)
        loss = model(torch.randn(6, 8, generator=generator), torch.randint(0, 4, (6,), generator=generator))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, torch.nn.Module]:
    root = tmp_path_factory.mktemp("stats")
    torch.manual_seed(0)
    reference = Net()
    train(copy.deepcopy(reference), root / "torch")
    return root / "torch", root / "ort", train(copy.deepcopy(reference), root / "ort")


def test_ort_records_what_pytorch_records(runs: tuple[Path, Path, torch.nn.Module]) -> None:
    torch_run, ort_run, ort_model = runs
    graph = ort_model._torch_module._execution_manager(True)._onnx_models.optimized_model.graph
    assert python_ops(graph, function_name(RecordStatistics)), "no recorder op ran in ORT"
    assert python_ops(graph, function_name(EndStep))

    a, b = load_run(torch_run, 0), load_run(ort_run, 0)
    assert sorted(a.steps) == sorted(b.steps) == list(range(STEPS))
    for step in range(STEPS):
        assert sorted(x.name for x in a.steps[step]) == sorted(x.name for x in b.steps[step])
    names = {x.name for x in a.steps[0]}
    assert {"embed/output_0", "blocks.1/output_0", "residual", "residual#2", "(root)/output_0"} <= names
    comparison = compare_runs(a, b, rtol=1e-5, atol=1e-6)
    assert comparison.compared == sum(len(v) for v in a.steps.values())
    assert comparison.within_tolerance, comparison


def test_a_changed_weight_in_ort_is_found(runs: tuple[Path, Path, torch.nn.Module], tmp_path: Path) -> None:
    """The control: the same comparison does fail when the ORT run's model differs."""
    torch_run, _, _ = runs
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        model.blocks[1].weight[0, 0] += 0.1
    train(model, tmp_path / "ort")
    comparison = compare_runs(load_run(torch_run, 0), load_run(tmp_path / "ort", 0), rtol=1e-5, atol=1e-6)
    assert not comparison.within_tolerance
    first = comparison.first_difference
    assert first is not None and (first.step, first.name) == (0, "blocks.1/output_0")


def test_the_window_applies_under_ort(tmp_path: Path) -> None:
    """ORT exports at step 0; a window starting later must still record, at run time, exactly its steps."""
    torch.manual_seed(0)
    train(Net(), tmp_path / "ort", start_step=1, end_step=2)
    assert sorted(load_run(tmp_path / "ort", 0).steps) == [1]


def test_ort_does_not_copy_the_recorders_outputs(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorders declare their outputs as views of their inputs (`alias_input`); without that, ORT's PythonOp
    kernel copies each output and says so on stdout ("A clone will be done ...") the first time it runs (with
    ORT_ZERO_SHOW_PYTHONOP_CLONES set: ort_zero's build of the kernel is quiet otherwise)."""
    monkeypatch.setenv("ORT_ZERO_SHOW_PYTHONOP_CLONES", "1")
    torch.manual_seed(0)
    model = train(Net(), tmp_path / "ort")
    assert model._torch_module._execution_manager(True)._execution_agent is not None, "no ORT session ran"
    printed = capfd.readouterr().out
    copied = [line for line in printed.splitlines() if "Forward" in line and "A clone will be done" in line]
    assert not copied, copied


@pytest.mark.parametrize("ort_zero_enabled", [False, True])
def test_ort_copies_the_recorders_gradients_only_without_ort_zero(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, ort_zero_enabled: bool
) -> None:
    """A recorder's backward hands each output gradient back as its input's gradient; ort_zero's training-graph pass
    plans that reuse and the recorders return borrowed views or copies to match (`passthrough_buffers`), so ORT's
    gradient kernels stop copying. Without ort_zero's ORT patches ORT copies and says so: the control that shows the
    check can fail."""
    monkeypatch.setenv("ORT_ZERO_SHOW_PYTHONOP_CLONES", "1")
    if ort_zero_enabled:
        ort_zero.enable_zero3()
    try:
        torch.manual_seed(0)
        model = train(Net(), tmp_path / "ort")
    finally:
        ort_zero.disable_zero3()
    assert model._torch_module._execution_manager(True)._execution_agent is not None, "no ORT session ran"
    printed = capfd.readouterr().out
    copied = [line for line in printed.splitlines() if "Backward" in line and "A clone will be done" in line]
    assert bool(copied) != ort_zero_enabled, copied

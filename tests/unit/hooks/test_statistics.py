"""StatisticsSubscriber and inspect_activation: exact statistics, bounded-memory buckets, the step window, export."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ort_zero.hooks import SubscriberManager, exporting
from ort_zero.hooks.statistics import StatisticsSubscriber, inspect_activation, step_file, tensor_statistics


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 6)
        self.act = torch.nn.ReLU()
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = inspect_activation("hidden", self.act(self.embed(x)))
        return self.head(hidden)


def subscribed(output_dir: Path, **options: object) -> tuple[Tiny, SubscriberManager, StatisticsSubscriber]:
    torch.manual_seed(0)
    model, manager = Tiny(), SubscriberManager()
    subscriber = StatisticsSubscriber(output_dir, **options)
    manager.subscribe(model, [subscriber])
    return model, manager, subscriber


def read(output_dir: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in step_file(output_dir, 0, step).read_text().splitlines()]


def reference(x: torch.Tensor) -> dict[str, float]:
    """What torch itself says, in float64."""
    d = x.detach().double()
    return {
        "mean": d.mean().item(),
        "std": d.std(correction=0).item(),
        "min": d.min().item(),
        "max": d.max().item(),
        "abs_mean": d.abs().mean().item(),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_statistics_match_torch(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    x = (torch.randn(7, 13) * 3 + 0.5).to(dtype)
    stats = tensor_statistics(x)
    assert stats["shape"] == [7, 13] and stats["numel"] == 91 and stats["dtype"] == str(dtype).removeprefix("torch.")
    for key, expected in reference(x).items():
        assert stats[key] == pytest.approx(expected, rel=1e-12, abs=1e-12), key
    assert stats["nan_count"] == 0 and stats["inf_count"] == 0


@pytest.mark.parametrize("bucket_size", [1, 5, 64, 1000, 10_000])
def test_buckets_equal_one_pass(bucket_size: int) -> None:
    torch.manual_seed(2)
    x = torch.randn(1000) * 100 + 1e4  # a large mean makes naive sum-of-squares lose the spread
    whole, bucketed = tensor_statistics(x), tensor_statistics(x, bucket_size=bucket_size)
    assert bucketed.keys() == whole.keys()
    for key in ("shape", "dtype", "numel", "min", "max", "nan_count", "inf_count"):
        assert bucketed[key] == whole[key], key
    for key in ("mean", "std", "abs_mean"):
        assert bucketed[key] == pytest.approx(whole[key], rel=1e-12), key
    assert whole["std"] == pytest.approx(x.double().std(correction=0).item(), rel=1e-12)


@pytest.mark.parametrize("bucket_size", [None, 3])
def test_nan_and_inf_are_counted(bucket_size: int | None) -> None:
    x = torch.tensor([1.0, float("nan"), 2.0, float("inf"), float("-inf"), float("nan"), 3.0])
    stats = tensor_statistics(x, bucket_size=bucket_size)
    assert stats["nan_count"] == 2 and stats["inf_count"] == 2
    assert all(math.isnan(stats[key]) for key in ("mean", "std", "min", "max"))  # NaN propagates, as in torch
    infinite = tensor_statistics(torch.tensor([1.0, float("inf"), 2.0]), bucket_size=bucket_size)
    assert infinite["inf_count"] == 1 and infinite["nan_count"] == 0
    assert infinite["mean"] == torch.tensor([1.0, float("inf"), 2.0]).mean().item() == math.inf
    assert infinite["max"] == math.inf and infinite["min"] == 1.0


@pytest.mark.parametrize("bucket_size", [None, 4])
def test_non_floating_tensors_get_shape_dtype_min_max(bucket_size: int | None) -> None:
    x = torch.tensor([[3, -7, 12], [5, 0, 2]], dtype=torch.int64)
    stats = tensor_statistics(x, bucket_size=bucket_size)
    assert stats == {"shape": [2, 3], "dtype": "int64", "numel": 6, "min": x.min().item(), "max": x.max().item()}
    flags = tensor_statistics(torch.tensor([False, True, False]), bucket_size=bucket_size)
    assert (flags["min"], flags["max"]) == (False, True)
    assert tensor_statistics(torch.empty(0, 3)) == {"shape": [0, 3], "dtype": "float32", "numel": 0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_compute_on_cpu_gives_the_same_numbers(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """Each bucket, not the whole tensor, is copied to the CPU when asked, and only then (on CPU `.cpu()` is free)."""
    copied: list[int] = []
    to_cpu = torch.Tensor.cpu

    def spy(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        copied.append(tensor.numel())
        return to_cpu(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", spy)
    x = (torch.randn(50) * 10).to(dtype)
    on_device = tensor_statistics(x, bucket_size=7)
    assert copied == []
    assert tensor_statistics(x, bucket_size=7, compute_on_cpu=True) == on_device
    assert copied == [7] * 7 + [1]


def test_records_every_module_output_in_forward_order(tmp_path: Path) -> None:
    model, _, _ = subscribed(tmp_path)
    x = torch.randn(5, 4)
    out = model(x)
    records = read(tmp_path, 0)
    names = [r["name"] for r in records]
    assert names == ["embed/output_0", "act/output_0", "hidden", "head/output_0", "(root)/output_0"]
    assert [r["index"] for r in records] == list(range(5))
    assert [r["kind"] for r in records][2:4] == ["activation", "module_output"]
    embedded = model.embed(x)
    for key, expected in reference(embedded).items():
        assert records[0][key] == pytest.approx(expected, rel=1e-12, abs=1e-12), key
    for key, expected in reference(out).items():
        assert records[-1][key] == pytest.approx(expected, rel=1e-12, abs=1e-12), key


def test_window_is_respected(tmp_path: Path) -> None:
    model, manager, _ = subscribed(tmp_path, start_step=1, end_step=3)
    for _ in range(5):
        model(torch.randn(2, 4))
    assert manager.run_context.global_step == 5
    assert sorted(p.name for p in (tmp_path / "rank_0").iterdir()) == ["step_1.jsonl", "step_2.jsonl"]


def test_repeated_module_calls_get_distinct_names(tmp_path: Path) -> None:
    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(self.layer(x))

    model = Twice()
    SubscriberManager().subscribe(model, [StatisticsSubscriber(tmp_path)])
    model(torch.randn(2, 3))
    assert [r["name"] for r in read(tmp_path, 0)] == ["layer/output_0", "layer/output_0#2", "(root)/output_0"]


def test_nothing_is_recorded_while_exporting(tmp_path: Path) -> None:
    model, manager, _ = subscribed(tmp_path)
    with exporting():
        model(torch.randn(2, 4))
    assert not (tmp_path / "rank_0").exists()
    assert manager.run_context.global_step == 0


def test_an_export_inside_an_open_step_records_nothing(tmp_path: Path) -> None:
    """ORTModule exports on its first call, inside the forward of a subscribed wrapper whose step is open."""

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Tiny()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with exporting():
                self.inner(x)
            return self.inner.head.weight.sum() * x.sum()

    model = Wrapper()
    SubscriberManager().subscribe(model, [StatisticsSubscriber(tmp_path)])
    model(torch.randn(2, 4))
    assert [r["name"] for r in read(tmp_path, 0)] == ["(root)/output_0"]


def test_nested_subscribers_hand_inspect_activation_back(tmp_path: Path) -> None:
    """A subscribed model called inside another's forward: afterwards, activations go to the outer dump again."""

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            inner(x)
            return inspect_activation("outer", self.proj(x))

    inner, _, _ = subscribed(tmp_path / "inner")
    outer = Outer()
    SubscriberManager().subscribe(outer, [StatisticsSubscriber(tmp_path / "outer")])
    outer(torch.randn(2, 4))
    assert [r["name"] for r in read(tmp_path / "outer", 0)] == ["proj/output_0", "outer", "(root)/output_0"]
    assert "hidden" in [r["name"] for r in read(tmp_path / "inner", 0)]


PLAIN_EXPORT = """
import importlib.util, io, sys, onnx, torch
spec = importlib.util.spec_from_file_location("statistics_tests", sys.argv[1])
tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tests)
model, _, _ = tests.subscribed(tests.Path(sys.argv[2]))
buffer = io.BytesIO()
torch.onnx.export(model, (torch.randn(2, 4),), buffer, dynamo=False)
print(sorted({node.op_type for node in onnx.load_from_string(buffer.getvalue()).graph.node}))
"""


def test_onnx_export_records_nothing_and_adds_no_nodes(tmp_path: Path) -> None:
    """A plain `torch.onnx.export`, in a process of its own: once ORTModule has been imported, ORT exports every
    autograd Function as a PythonOp (the recorders too), so in this process the result would depend on test order."""
    run = subprocess.run(
        [sys.executable, "-c", PLAIN_EXPORT, __file__, str(tmp_path / "stats")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    ops = set(ast.literal_eval(run.stdout.strip().splitlines()[-1]))
    assert ops <= {"Gemm", "Relu", "MatMul", "Add"}, ops
    assert not (tmp_path / "stats").exists()


def test_inspect_activation_returns_its_input_and_is_a_no_op_outside_a_step(tmp_path: Path) -> None:
    x = torch.randn(3)
    assert inspect_activation("free", x) is x  # no subscriber recording
    model, _, _ = subscribed(tmp_path, end_step=1)
    model(torch.randn(2, 4))
    assert inspect_activation("after the forward", x) is x
    model(torch.randn(2, 4))  # outside the window: its inspect_activation("hidden") must not land in step 0
    assert [r["name"] for r in read(tmp_path, 0)].count("hidden") == 1
    assert not step_file(tmp_path, 0, 1).exists()
    assert all(r["name"] != "after the forward" for r in read(tmp_path, 0))


def test_inspect_activation_records_the_tensor_it_is_given(tmp_path: Path) -> None:
    model, _, _ = subscribed(tmp_path)
    x = torch.randn(4, 4)
    model(x)
    hidden = model.act(model.embed(x))
    record = next(r for r in read(tmp_path, 0) if r["name"] == "hidden")
    assert record["shape"] == [4, 6] and record["kind"] == "activation"
    for key, expected in reference(hidden).items():
        assert record[key] == pytest.approx(expected, rel=1e-12, abs=1e-12), key


def test_inspect_activation_does_not_change_gradients(tmp_path: Path) -> None:
    plain = Tiny()
    model, _, _ = subscribed(tmp_path)
    plain.load_state_dict(model.state_dict())
    x = torch.randn(3, 4)
    model(x).sum().backward()
    plain(x).sum().backward()
    for (name, a), b in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name


def test_rerun_into_the_same_folder_replaces_the_step(tmp_path: Path) -> None:
    for _ in range(2):
        model, _, _ = subscribed(tmp_path)
        model(torch.randn(2, 4))
    assert len(read(tmp_path, 0)) == 5


def test_bucket_size_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bucket_size"):
        StatisticsSubscriber(tmp_path, bucket_size=0)

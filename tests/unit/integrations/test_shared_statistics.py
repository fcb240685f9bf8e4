"""Statistics combined from shares equal those of the whole tensor; a ZeRO-3 partition's padding is left out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ort_zero.hooks.statistics import tensor_statistics
from ort_zero.integrations import shared_statistics

KEYS = ("mean", "std", "abs_mean", "min", "max", "nan_count", "inf_count")


def test_one_ranks_whole_tensor_gives_the_whole_tensors_statistics() -> None:
    """Summed pairwise in float32: within 1e-6 of float64's, far inside every tolerance a comparison uses."""
    tensor = torch.randn(100_000, dtype=torch.float32) * 3 + 0.5
    (combined,) = shared_statistics.combined([tensor])
    exact = tensor_statistics(tensor)
    for key in KEYS:
        assert combined[key] == pytest.approx(exact[key], rel=1e-6, abs=1e-12), key
    assert combined["numel"] == 100_000


@pytest.mark.parametrize(
    "values",
    [[1.0, float("nan"), 2.0], [1.0, float("inf"), -float("inf")], [3e30, -2e30, 1.0]],
    ids=["a NaN", "infinities", "float32's squares overflow"],
)
def test_non_finite_values_and_float32_overflow(values: list[float]) -> None:
    tensor = torch.tensor(values)
    stats, exact = shared_statistics.whole(tensor), tensor_statistics(tensor)
    for key in KEYS:
        assert stats[key] == pytest.approx(exact[key], rel=1e-6, nan_ok=True), key


def test_a_module_output_in_bf16_keeps_its_shape_and_dtype() -> None:
    tensor = torch.randn(4, 8).bfloat16()
    stats = shared_statistics.whole(tensor)
    assert stats["shape"] == [4, 8] and stats["dtype"] == "bfloat16" and stats["numel"] == 32
    assert stats["mean"] == pytest.approx(tensor_statistics(tensor)["mean"], rel=1e-6, abs=1e-9)
    assert shared_statistics.whole(torch.empty(0, 3)) == {"shape": [0, 3], "dtype": "float32", "numel": 0}


def test_a_parameter_without_a_gradient_has_no_statistics() -> None:
    assert shared_statistics.combined([None, torch.ones(3)])[0] is None


def test_a_partition_past_the_parameters_end_is_cut() -> None:
    """A parameter of 10 elements in partitions of 16: rank 0 (this process) holds the 10 and 6 of padding."""
    param = SimpleNamespace(ds_numel=10)
    share = shared_statistics._without_padding(torch.arange(16.0), param)
    assert share.tolist() == list(range(10))


def test_the_spread_of_a_tensor_far_from_zero_is_kept() -> None:
    """Squares summed in float32 lose a spread 1e-4 of the mean (a scalar loss got a std of 6e-4); `var_mean` not."""
    tensor = torch.randn(100_000) * 1e-3 + 5.0
    assert shared_statistics.whole(tensor)["std"] == pytest.approx(tensor_statistics(tensor)["std"], rel=1e-5)
    assert shared_statistics.whole(torch.tensor([4.961041]))["std"] == 0.0

"""Statistics combined from shares equal those of the whole tensor; a ZeRO-3 partition's padding is left out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ort_zero.hooks.statistics import tensor_statistics
from ort_zero.integrations import shared_statistics


def test_one_ranks_whole_tensor_gives_the_whole_tensors_statistics() -> None:
    tensor = torch.randn(1000, dtype=torch.float32) * 3 + 0.5
    (combined,) = shared_statistics.combined([tensor])
    whole = tensor_statistics(tensor)
    for key in ("mean", "std", "abs_mean", "min", "max", "nan_count", "inf_count"):
        assert combined[key] == pytest.approx(whole[key], rel=1e-9, abs=1e-12), key
    assert combined["numel"] == 1000


def test_a_parameter_without_a_gradient_has_no_statistics() -> None:
    assert shared_statistics.combined([None, torch.ones(3)])[0] is None


def test_a_partition_past_the_parameters_end_is_cut() -> None:
    """A parameter of 10 elements in partitions of 16: rank 0 (this process) holds the 10 and 6 of padding."""
    param = SimpleNamespace(ds_numel=10)
    share = shared_statistics._without_padding(torch.arange(16.0), param)
    assert share.tolist() == list(range(10))

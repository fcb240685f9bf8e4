"""`ort-zero compare`: exit 0 for identical runs, 1 naming the first differing activation, 2 on bad input."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from ort_zero.cli import compare
from ort_zero.cli.main import main
from ort_zero.hooks import SubscriberManager
from ort_zero.hooks.statistics import StatisticsSubscriber, inspect_activation


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = inspect_activation("hidden", torch.tanh(self.embed(x)))
        return inspect_activation("loss", torch.nn.functional.mse_loss(self.head(hidden), y))


def train(output_dir: Path, perturb: float = 0.0, steps: int = 3) -> Path:
    """A few SGD steps of the same model on the same data, with the head's first weight nudged by `perturb`."""
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():
        model.head.weight[0, 0] += perturb
    SubscriberManager().subscribe(model, [StatisticsSubscriber(output_dir)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(6, 4, generator=data), torch.randn(6, 2, generator=data)
        model(x, y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return output_dir


def run_compare(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    return compare.run(parser.parse_args(list(argv)))


def test_same_seed_runs_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = train(tmp_path / "a"), train(tmp_path / "b")
    assert run_compare(str(a), str(b)) == 0
    out = capsys.readouterr().out
    assert "step 2: 5 compared, 0 differ" in out and "all compared statistics within tolerance" in out


def test_perturbed_weight_is_found_at_its_first_activation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = train(tmp_path / "a"), train(tmp_path / "b", perturb=0.05)
    summary = tmp_path / "report" / "summary.md"
    assert run_compare(str(a), str(b), "--output", str(summary)) == 1
    out = capsys.readouterr().out
    # embed and hidden come before the head in forward order and are untouched at step 0
    assert "step 0: 5 compared, 3 differ" in out
    assert "first difference: step 0, activation 'head/output_0'" in out
    assert "**First difference:** step 0, `head/output_0`" in summary.read_text()


def test_loose_tolerance_accepts_the_perturbation(tmp_path: Path) -> None:
    a, b = train(tmp_path / "a"), train(tmp_path / "b", perturb=1e-7)
    assert run_compare(str(a), str(b), "--rtol", "1e-3", "--atol", "1e-5") == 0
    assert run_compare(str(a), str(b), "--rtol", "0", "--atol", "0") == 1


def test_missing_folder_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = train(tmp_path / "a", steps=1)
    assert run_compare(str(a), str(tmp_path / "nowhere")) == 2
    err = capsys.readouterr().err
    assert "ort-zero compare: error: run folder not found" in err and "nowhere" in err


def test_missing_rank_and_empty_dumps_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = train(tmp_path / "a", steps=1)
    assert run_compare(str(a), str(a), "--rank", "1") == 2
    assert "no statistics for rank 1" in capsys.readouterr().err
    (tmp_path / "empty" / "rank_0").mkdir(parents=True)
    assert run_compare(str(a), str(tmp_path / "empty")) == 2
    assert "no statistics recorded" in capsys.readouterr().err
    assert run_compare(str(a), str(a), "--atol", "-1") == 2


def test_runs_with_nothing_in_common_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = train(tmp_path / "a", steps=1)
    later = tmp_path / "b"
    train(later, steps=2)
    (later / "rank_0" / "step_0.jsonl").unlink()
    assert run_compare(str(a), str(later)) == 2
    assert "no step and activation in common" in capsys.readouterr().err


def test_through_the_console_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = train(tmp_path / "a", steps=1), train(tmp_path / "b", steps=1, perturb=0.05)
    assert main(["compare", str(a), str(b), "--rank", "0"]) == 1
    assert "activation 'head/output_0'" in capsys.readouterr().out

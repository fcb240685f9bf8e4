"""The stdlib byte corpus and its sampler: deterministic, one slice of the global batch per rank, next-byte labels."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

from ort_zero.data import load_corpus, sample_batch, stdlib_files


def test_files_are_sorted_stdlib_sources_without_third_party_code() -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    assert len(files) > 100
    assert all(p.suffix == ".py" and p.is_relative_to(root) for p in files)
    assert [p.relative_to(root).as_posix() for p in files] == sorted(p.relative_to(root).as_posix() for p in files)
    assert not any("site-packages" in p.parts for p in files)
    assert root / "os.py" in files


def test_corpus_is_capped_and_is_python_source() -> None:
    corpus = load_corpus(64 * 1024)
    assert corpus.dtype == torch.uint8 and corpus.shape == (64 * 1024,)
    first = stdlib_files()[0].read_bytes()
    assert bytes(corpus[: len(first)].tolist()) == first[: 64 * 1024]


def test_same_seed_same_batch_other_seed_or_step_other_batch() -> None:
    a = sample_batch(seed=7, step=3, rank=0, world_size=2, micro_batch=4, seq_len=16)
    b = sample_batch(seed=7, step=3, rank=0, world_size=2, micro_batch=4, seq_len=16)
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    assert not torch.equal(a["input_ids"], sample_batch(8, 3, 0, 2, 4, 16)["input_ids"])
    assert not torch.equal(a["input_ids"], sample_batch(7, 4, 0, 2, 4, 16)["input_ids"])


def test_labels_are_the_next_byte() -> None:
    batch = sample_batch(seed=0, step=0, rank=1, world_size=2, micro_batch=3, seq_len=20)
    assert batch["input_ids"].shape == batch["labels"].shape == (3, 20)
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.int64
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    corpus = load_corpus()
    window = bytes(batch["input_ids"][0].tolist()) + bytes(batch["labels"][0, -1:].tolist())
    assert window in corpus.numpy().tobytes()


def test_ranks_read_disjoint_rows_of_one_global_batch() -> None:
    ranks = [
        sample_batch(seed=1, step=5, rank=r, world_size=4, micro_batch=2, seq_len=32)["input_ids"] for r in range(4)
    ]
    rows = {tuple(row.tolist()) for batch in ranks for row in batch}
    assert len(rows) == 8, "two ranks got the same window"
    whole = sample_batch(seed=1, step=5, rank=0, world_size=1, micro_batch=8, seq_len=32)["input_ids"]
    assert torch.equal(torch.cat(ranks), whole), "the ranks' slices are not the rows of the global batch"


@pytest.mark.parametrize(
    ("rank", "world_size", "micro_batch", "seq_len"), [(2, 2, 1, 8), (-1, 2, 1, 8), (0, 1, 0, 8), (0, 1, 1, 0)]
)
def test_rejects_bad_arguments(rank: int, world_size: int, micro_batch: int, seq_len: int) -> None:
    with pytest.raises(ValueError):
        sample_batch(0, 0, rank, world_size, micro_batch, seq_len)

"""A byte-level text corpus every machine already has: the Python standard library's own source files.

Training machines are often offline, so examples and tests must not download data. The corpus is the sorted list of
the interpreter's stdlib `.py` files, concatenated and capped, so the same interpreter always yields the same bytes.
Batches are a pure function of (seed, step, rank, world size, shape): runs are reproducible, a resumed run sees the
batches it would have seen, and each rank reads its own rows of one global batch.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from pathlib import Path

import torch

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
_SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}  # third-party code differs between machines


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's `.py` files in a fixed order (sorted by path relative to the stdlib root)."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    files = []
    for folder, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED_DIRS]  # pruned, not filtered: site-packages is large
        files.extend(Path(folder, name) for name in filenames if name.endswith(".py"))
    return sorted((p for p in files if p.is_file()), key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=4)
def load_corpus(max_bytes: int = DEFAULT_MAX_BYTES) -> torch.Tensor:
    """The first `max_bytes` bytes of the stdlib files joined by blank lines, as a 1-D uint8 tensor (cached)."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    chunks, size = [], 0
    for path in stdlib_files():
        chunk = path.read_bytes() + b"\n\n"
        chunks.append(chunk)
        size += len(chunk)
        if size >= max_bytes:
            break
    data = b"".join(chunks)[:max_bytes]
    if not data:
        raise RuntimeError(f"no .py files under {sysconfig.get_paths()['stdlib']}: cannot build the corpus")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def batch_seed(seed: int, step: int) -> int:
    """A 63-bit generator seed from (seed, step) that does not collide for nearby pairs, unlike seed + step."""
    digest = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def step_seed(seed: int, step: int, rank: int) -> int:
    """Torch's seed for one micro-step on one rank: dropout differs between ranks and steps, never between runs."""
    digest = hashlib.blake2b(f"{seed}:{step}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def sample_batch(
    seed: int,
    step: int,
    rank: int,
    world_size: int,
    micro_batch: int,
    seq_len: int,
    corpus: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """This rank's rows of the global batch for `step`: `input_ids` and `labels` (the next byte), int64 [micro, seq].

    The global batch (world_size * micro_batch windows at random offsets) depends only on (seed, step); rank r takes
    rows [r * micro_batch, (r + 1) * micro_batch).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if micro_batch <= 0 or seq_len <= 0:
        raise ValueError(f"micro_batch and seq_len must be positive, got {micro_batch} and {seq_len}")
    corpus = load_corpus() if corpus is None else corpus
    if corpus.numel() < seq_len + 1:
        raise ValueError(f"corpus of {corpus.numel()} bytes is shorter than a window of {seq_len + 1}")
    generator = torch.Generator().manual_seed(batch_seed(seed, step))
    offsets = torch.randint(0, corpus.numel() - seq_len, (world_size * micro_batch,), generator=generator)
    mine = offsets[rank * micro_batch : (rank + 1) * micro_batch]
    windows = corpus[mine.unsqueeze(1) + torch.arange(seq_len + 1)].long()
    return {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}


class CorpusWindows(torch.utils.data.Dataset):
    """`count` byte windows of `seq_len` at offsets drawn from `seed`, as items for a causal LM that shifts its own
    labels (Hugging Face models): {"input_ids", "labels"}, the same int64 window. A pure function of its arguments,
    so two runs, and a fresh process checking a saved model, see the same items."""

    def __init__(self, seed: int, count: int, seq_len: int, corpus: torch.Tensor | None = None) -> None:
        if count <= 0 or seq_len <= 0:
            raise ValueError(f"count and seq_len must be positive, got {count} and {seq_len}")
        corpus = load_corpus() if corpus is None else corpus
        if corpus.numel() < seq_len:
            raise ValueError(f"corpus of {corpus.numel()} bytes is shorter than a window of {seq_len}")
        generator = torch.Generator().manual_seed(seed)
        offsets = torch.randint(0, corpus.numel() - seq_len + 1, (count,), generator=generator)
        self.windows = corpus[offsets.unsqueeze(1) + torch.arange(seq_len)].long()

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[index], "labels": self.windows[index]}

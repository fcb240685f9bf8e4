"""Data for examples and tests that needs no download."""

from .stdlib_corpus import load_corpus, sample_batch, stdlib_files

__all__ = ["load_corpus", "sample_batch", "stdlib_files"]

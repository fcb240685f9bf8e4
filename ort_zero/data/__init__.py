"""Data for examples and tests that needs no download."""

from .stdlib_corpus import CorpusWindows, load_corpus, sample_batch, stdlib_files, step_seed

__all__ = ["CorpusWindows", "load_corpus", "sample_batch", "stdlib_files", "step_seed"]

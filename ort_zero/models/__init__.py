"""Models written in the repository for examples and tests: small, ONNX-exportable, no downloads."""

from .gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]

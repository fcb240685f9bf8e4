"""Runnable examples: `python -m ort_zero.examples.train_gpt` under any launcher; `config` is shared with tools."""

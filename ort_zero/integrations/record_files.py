"""A run record's files: what `run_record` writes and `tools.record_comparison` reads (neither imports the other).

`record.json`: the run (parameters and shapes, ZeRO stage, ranks, accumulation, global batch, precision, backend).
`steps.jsonl`: a line per optimizer step: `step`, `loss`, `grad_norm`, `samples` (digests), `activations` (module
outputs, PyTorch runs; else null), `grads` and `params` (statistics by parameter name).
"""

RECORD = "record.json"
STEPS = "steps.jsonl"

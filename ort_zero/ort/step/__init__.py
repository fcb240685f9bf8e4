"""What ONNX Runtime calls back into at step time, besides the ZeRO-3 bridges (`ort_zero.zero3`): the autograd
Functions its PythonOps run.

    torch_kernels/   torch's own kernels for attention, experts, linear layers, the loss and 16-bit elementwise math
    functions.py     the Functions the graph passes insert (parameter placeholders, gradient retrieval, 16-bit sums)
    python_ops.py    torch ops ORT cannot run or differentiate, run by torch
    tensor_outputs.py  a model's own autograd Functions with tensor outputs only and one gradient per input
    kept_graph.py    a forward that keeps torch's graph for the backward to run through

They also run, once, while the model is traced for its export (`hooks.export_mode.is_exporting`); what decides
where they go in the graph is `ort_zero.ort.export` (the replacements that call them) and `ort_zero.ort.passes`.
Nothing here imports those: `tests/unit/test_layers.py`.
"""

"""ort_zero's ONNX graph passes, one per file, in the order `pipeline.py` runs them."""

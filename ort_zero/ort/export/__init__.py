"""Exporting a model to ONNX for ORT: what torch's exporter cannot write or ORT cannot run, written ort_zero's way."""

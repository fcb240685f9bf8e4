"""Reading and editing ONNX graphs: the helpers ort_zero's passes share."""

"""ORTModule's own code, replaced where it fails under ZeRO-3 or on today's torch (declared in `ort_zero.patches`)."""

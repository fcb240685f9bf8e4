"""Where ort_zero reaches past other packages' public APIs: one module per package (onnxruntime, deepspeed, torch,
accelerate).

Each module names every private attribute or module of its package that ort_zero reads, and is the only code in
ort_zero that assigns into that package's objects (the replacements declared in `ort_zero.patches` are the other
door). onnxruntime, deepspeed and torch were written for the versions in `versions.py`, the ranges the patches of the
same package declare: every reach through them happens in a run whose patches of that package applied, and applying
them checks the installed version. accelerate has no patches: its module was written for the versions setup.py admits,
which `ort-zero doctor` checks. The exception is DeepSpeed's ZeRO-3 parameter protocol (`ds_*` attributes of
parameters and modules), which ort_zero's hooks set where DeepSpeed's own hooks would.
"""

"""What ORTModule prints, cut to what a user of ort_zero needs (the replacements are declared in `ort_zero.patches`).

An ORT run printed 36 lines more than the same native DeepSpeed run (small GPT, 2 ranks, torch 2.14), none of them
news to the user: ORT's feature table (which says "ZeRO Stage3 Support: OFF" and points at ORT's own memory
optimizer while ort_zero runs ZeRO-3 and its own recompute), a warning about a deep copy that ort_zero skips on
purpose, ORT's captured export log (records its filter did not recognise), and, on every rank, torch's note that a
CUDA build finds no CUDA runtime and ORT's note that a CPU machine has no cudart version. What ran is in
`ort_zero.ort.inspection.ort_run_record`; ORT's details come back with ORTMODULE_LOG_LEVEL=INFO or lower.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any

from ...foreign import onnxruntime as ort_internals

# ORT's own phrases, matched in the records of its logger.
NOT_DEEP_COPIED = "Since the user requested not to deep copy this model"
CAPTURED_LOG = "Filtered logs ("
FAST_PATH = "Fast path enabled - skipping checks"  # ORT's default since 1.16, said once per graph
# torch.utils.cpp_extension says so whenever ORT loads its extensions on a machine without CUDA; onnxruntime says
# so at import on any machine without CUDA. ort_zero checks ORT's CUDA provider itself (stack/cuda_provider.py).
NO_CUDA_RUNTIME = "No CUDA runtime is found"
NO_CUDART_VERSION = "failed to get cudart_version from onnxruntime build info"
COLLISION = "collides with ORTModule's attribute name"
# Where the methods of the models people wrap come from; zero.Init adds `_old_init` to every class it builds.
LIBRARIES = {"torch", "transformers", "deepspeed", "peft", "trl", "accelerate"}
ADDED_BY_ZERO_INIT = "_old_init"


class OrtRecords(logging.Filter):
    """On ORT's logger: drops the deep-copy warning (ort_zero never deep-copies a ZeRO-3 model: its copies would
    lose DeepSpeed's attributes) and demotes to DEBUG ORT's captured export log and its note that it skips input
    checks (its default fast path)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(NOT_DEEP_COPIED):
            return False
        if CAPTURED_LOG in message.partition("\n")[0] or message.startswith(FAST_PATH):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


class _WithoutMessage(logging.Filter):
    def __init__(self, phrase: str) -> None:
        super().__init__()
        self.phrase = phrase

    def filter(self, record: logging.LogRecord) -> bool:
        return self.phrase not in record.getMessage()


class LibraryCollisions(logging.Filter):
    """While ORTModule wraps a model: drops ORT's warning that one of the model's methods collides with ORTModule's
    where a library defined that method (a PreTrainedModel's `to`, `cuda`, `half`, `float`, `train`, `eval`):
    ORTModule's own applies to the wrapped model, as the library's does. The user's own methods are still warned of."""

    def __init__(self, model_type: type) -> None:
        super().__init__()
        self.model_type = model_type

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if COLLISION not in message:
            return True
        name = message.removeprefix("User Module's attribute name ").partition(" ")[0]
        return not defined_by_a_library(self.model_type, name)


def defined_by_a_library(model_type: type, name: str) -> bool:
    if name == ADDED_BY_ZERO_INIT:
        return True
    owner = next((cls for cls in model_type.__mro__ if name in vars(cls)), None)
    return owner is not None and owner.__module__.partition(".")[0] in LIBRARIES


def quiet_wrapping(check: Callable[..., None]) -> Callable[..., None]:
    """Replaces ORTModule's check of the wrapped model's attributes, which reads every one of them: deprecated
    properties warn when read (transformers' `is_gradient_checkpointing`), and methods a library defined are
    reported as collisions (`LibraryCollisions`)."""

    @functools.wraps(check)
    def check_for_name_collisions(ort_module: Any, model: Any, ort_logger: logging.Logger, *args: Any) -> None:
        collisions = LibraryCollisions(type(model))
        ort_logger.addFilter(collisions)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                return check(ort_module, model, ort_logger, *args)
        finally:
            ort_logger.removeFilter(collisions)

    return check_for_name_collisions


_ORT_RECORDS = OrtRecords()
_NO_CUDA_RUNTIME = _WithoutMessage(NO_CUDA_RUNTIME)


def quiet_logger(configure: Callable[..., logging.Logger]) -> Callable[..., logging.Logger]:
    """Replaces ORTModule's `configure_ortmodule_logger`: the logger it returns carries `OrtRecords`."""

    @functools.wraps(configure)
    def configure_ortmodule_logger(*args: Any, **kwargs: Any) -> logging.Logger:
        ort_logger = configure(*args, **kwargs)
        ort_logger.addFilter(_ORT_RECORDS)  # a logger holds a filter once, however often it is added
        return ort_logger

    return configure_ortmodule_logger


def feature_table_unless_zero3(original: Callable) -> Callable:
    """Replaces `GraphExecutionManager._log_feature_stats`: no table for a ZeRO-3 model, whose ZeRO and memory
    optimizer rows describe ORT's code that ort_zero replaces; at ORT's INFO level and below one line says so."""

    from ..export.context import is_zero3_module

    @functools.wraps(original)
    def _log_feature_stats(self: Any) -> None:
        if not is_zero3_module(ort_internals.flattened_module(self)):
            return original(self)
        ort_internals.manager_logger(self).info(
            "ort_zero: ORT's feature table is not shown for a ZeRO-3 model (its ZeRO Stage3 and Memory Optimizer rows "
            "describe ORT's own code, which ort_zero replaces); what ran: ort_zero.ort.inspection.ort_run_record"
        )
        return None

    return _log_feature_stats


def quiet_imports() -> None:
    """Before ORT is first imported (`ort_zero.ort_import`): the import-time notes that concern no user of ort_zero
    (filters only; nothing is imported). Besides the two about CUDA: ORT's own ZeRO-3 subscriber (replaced by
    ort_zero's, never used) fails to import on DeepSpeed >= 0.14 and warns about it whenever ORTModule is imported."""
    logging.getLogger("torch.utils.cpp_extension").addFilter(_NO_CUDA_RUNTIME)
    warnings.filterwarnings("ignore", message=f"WARNING: {NO_CUDART_VERSION}")
    warnings.filterwarnings("ignore", message="DeepSpeed import error cannot import name '_apply_to_tensors_only'")

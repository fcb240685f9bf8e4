"""Train a toy model with DeepSpeed ZeRO-3 on this rank: native, through ort_zero in PyTorch, or in ORT.

Writes `<out>/rank<r>.json` with per-step losses (and, on rank 0, the final gathered parameters).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.runtime.zero.linear import zero3_linear_wrap
from zero3_models import MODELS, batch

VARIANTS = {
    "base": {},
    "accum": {"gradient_accumulation_steps": 2},
    "offload": {"zero_optimization": {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}},
    "clip": {"gradient_clipping": 0.5},
    "leaf": {},  # the model's nn.Sequential becomes a z3 leaf module
    "reexport": {},  # input_ids turn int32 halfway: a new input schema, ORTModule exports again (checks enabled)
}


PRECISIONS = {
    "fp32": {},
    "bf16": {"bf16": {"enabled": True}},
    "fp16": {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}},
}


def config(variant: str, stage: int, precision: str = "fp32") -> dict:
    base = {
        **PRECISIONS[precision],
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 64},
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    for key, value in VARIANTS[variant].items():
        if isinstance(value, dict):
            base[key] = {**base.get(key, {}), **value}
        else:
            base[key] = value
    return base


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["native", "torch", "ort"], required=True)
    parser.add_argument("--model", choices=sorted(MODELS), default="zoo")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="base")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stage", type=int, choices=[0, 1, 2, 3], default=3)
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32")
    parser.add_argument("--mem-grads", action="store_true", help="ort_zero's memory-efficient gradients")
    parser.add_argument("--switch", choices=["api", "env"], default="api", help="enable_zero3() or ORT's env var")
    parser.add_argument("--dropout-seed", type=int, default=None, help="reseed after init: other dropout masks")
    parser.add_argument(
        "--torch-backward",
        nargs="?",
        const="scalar",
        choices=["scalar", "nonscalar"],
        help="loss.backward() instead of engine.backward; nonscalar: backward from the loss and the logits at once",
    )
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()

    if args.mode != "native" and args.switch == "env":
        os.environ["ORTMODULE_ENABLE_ZERO_STAGE3"] = "1"
        import ort_zero  # noqa: F401  (honours the variable on import)
    elif args.mode != "native":
        import ort_zero

        ort_zero.enable_zero3(mem_efficient_grads=args.mem_grads)
    # after the switch: importing ort_zero reads the variable
    from ort_zero.distributed import init_distributed, shut_down_distributed

    rank, _ = init_distributed()
    torch.manual_seed(0)
    model = MODELS[args.model]()
    if args.dropout_seed is not None:
        torch.manual_seed(args.dropout_seed)
    if args.variant == "leaf":
        deepspeed.utils.set_z3_leaf_modules(model, [torch.nn.Sequential])
    if args.mode == "ort":
        from onnxruntime.training.ortmodule import ORTModule

        if args.variant == "reexport":
            # ORTModule's default fast path never looks at the inputs again after the first export
            os.environ["ORTMODULE_SKIPCHECK_POLICY"] = "SKIP_CHECK_DISABLED"

        model = ORTModule(model)
    # eps well above float32 noise: with the default 1e-8, Adam turns 1e-9 differences in near-zero gradients
    # (ORT and PyTorch sum in different orders) into lr-sized steps, hiding real mismatches behind noise.
    trainable = [p for p in model.parameters() if p.requires_grad]
    received: set[str] = set()  # the dtypes of the gradients DeepSpeed's own gradient hooks receive
    for param in trainable:
        param.register_post_accumulate_grad_hook(lambda p: received.add(str(p.grad.dtype)))
    optimizer = torch.optim.Adam(trainable, lr=3e-3, eps=1e-6)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=config(args.variant, args.stage, args.precision)
    )

    losses, grad_norms, exports = [], [], []  # exports: each training graph's info, kept alive
    for step in range(args.steps):
        inputs = batch(step, rank, device=engine.device)
        if args.variant == "reexport" and step >= args.steps // 2:
            inputs["input_ids"] = inputs["input_ids"].int()
        outputs = engine(**inputs)
        loss = outputs["loss"]
        if args.torch_backward == "scalar":
            loss.backward()  # PyTorch-style: DeepSpeed runs its backward prologue and epilogue from hooks
        elif args.torch_backward == "nonscalar":
            # half the loss, plus half its cross-entropy's gradient fed to the (non-scalar) logits directly
            logits = outputs["logits"]
            grad = torch.softmax(logits.detach(), dim=-1)
            grad.view(-1, grad.shape[-1])[
                torch.arange(grad.numel() // grad.shape[-1]), inputs["labels"].reshape(-1)
            ] -= 1
            grad /= grad.numel() // grad.shape[-1]
            torch.autograd.backward([loss, logits], [torch.tensor(0.5), 0.5 * grad])
        else:
            engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        grad_norms.append(engine.get_global_grad_norm())
        if args.mode == "ort":
            info = training_manager(engine)._graph_transition_manager._exported_model_info
            if not any(info is seen for seen in exports):
                exports.append(info)
    held_out = batch(10**6, rank, device=engine.device)
    with torch.no_grad():
        eval_loss = engine(**held_out)["loss"].item()  # no_grad: ORTModule's inference graph
    engine.eval()  # eval mode: the same graph, and dropout would be off
    with torch.no_grad():
        eval_mode_loss = engine(**held_out)["loss"].item()
    engine.train()

    offload = getattr(engine.optimizer, "parameter_offload", None)
    result = {
        "losses": losses,
        "grad_norms": [float(n) if n is not None else None for n in grad_norms],
        "eval_loss": eval_loss,
        "eval_mode_loss": eval_mode_loss,
        "ort_zero_hooks": hasattr(offload, "ort_zero_subscriber"),
        # DeepSpeed's coordinator completes its module trace (prefetching, keeping parameters gathered between
        # forward and backward) only if every step starts with reset_step
        "trace_complete": offload is not None and offload.get_param_coordinator().is_complete_trace(),
        # DeepSpeed swaps F.linear for its memory-efficient LinearFunctionForZeroStage3 under ZeRO-3 (on by default)
        "memory_efficient_linear": torch.nn.functional.linear is zero3_linear_wrap,
        "dtypes": dtypes(engine, received),
        "skipped_steps": engine.skipped_steps,  # fp16: steps dynamic loss scaling skipped on overflow
    }
    if args.mode == "ort":
        from ort_zero.ort.inspection import ort_run_record

        record = ort_run_record(engine.module)
        result["ort_session"] = record["training"]["session"]
        result["providers"] = record["training"]["providers"]
        result["python_ops"] = record["training"]["python_ops"]
        result["backward_reads_of_forward_gathers"] = record["training"]["backward_reads_of_forward_gathers"]
        result["inference_session"] = record["inference"]["session"]
        result["inference_python_ops"] = record["inference"]["python_ops"]
        result["training_exports"] = len(exports)
    named = list(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in named], enabled=args.stage == 3):
        if rank == 0:
            result["params"] = {name: p.detach().double().flatten().tolist() for name, p in named}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(result))
    shut_down_distributed()


def dtypes(engine: deepspeed.DeepSpeedEngine, received: set[str]) -> dict[str, list[str]]:
    """What ZeRO-3 holds and receives, by dtype: the parameters as modules see them, their partitions, the
    optimizer's master partitions and the gradients handed to DeepSpeed's hooks."""
    params = [p for p in engine.module.parameters() if p.requires_grad]
    masters = getattr(engine.optimizer, "fp32_partitioned_groups_flat", [])
    return {
        "params": sorted({str(p.dtype) for p in params}),
        "partitions": sorted({str(p.ds_tensor.dtype) for p in params if hasattr(p, "ds_tensor")}),
        "masters": sorted({str(m.dtype) for m in masters}),
        "grads": sorted(received),
    }


def training_manager(engine: deepspeed.DeepSpeedEngine) -> Any:
    return engine.module._torch_module._execution_manager(is_training=True)


if __name__ == "__main__":
    os.environ.setdefault("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    main()

"""Train a toy model with DeepSpeed ZeRO-3 on this rank: native, through ort_zero in PyTorch, or in ORT.

Writes `<out>/rank<r>.json` with per-step losses (and, on rank 0, the final gathered parameters).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import deepspeed
import torch
from zero3_models import MODELS, batch

VARIANTS = {
    "base": {},
    "accum": {"gradient_accumulation_steps": 2},
    "offload": {"zero_optimization": {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}},
    "clip": {"gradient_clipping": 0.5},
    "leaf": {},  # the model's nn.Sequential becomes a z3 leaf module
}


def config(variant: str, stage: int) -> dict:
    base = {
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
    parser.add_argument("--stage", type=int, choices=[2, 3], default=3)
    parser.add_argument("--mem-grads", action="store_true", help="ort_zero's memory-efficient gradients")
    parser.add_argument("--switch", choices=["api", "env"], default="api", help="enable_zero3() or ORT's env var")
    parser.add_argument("--dropout-seed", type=int, default=None, help="reseed after init: other dropout masks")
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()

    if args.mode != "native" and args.switch == "env":
        os.environ["ORTMODULE_ENABLE_ZERO_STAGE3"] = "1"
        import ort_zero  # noqa: F401  (honours the variable on import)
    elif args.mode != "native":
        import ort_zero

        ort_zero.enable_zero3(mem_efficient_grads=args.mem_grads)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = MODELS[args.model]()
    if args.dropout_seed is not None:
        torch.manual_seed(args.dropout_seed)
    if args.variant == "leaf":
        deepspeed.utils.set_z3_leaf_modules(model, [torch.nn.Sequential])
    if args.mode == "ort":
        from onnxruntime.training.ortmodule import ORTModule

        model = ORTModule(model)
    # eps well above float32 noise: with the default 1e-8, Adam turns 1e-9 differences in near-zero gradients
    # (ORT and PyTorch sum in different orders) into lr-sized steps, hiding real mismatches behind noise.
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=3e-3, eps=1e-6)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config(args.variant, args.stage))

    losses = []
    for step in range(args.steps):
        inputs = batch(step, rank)
        loss = engine(**inputs)["loss"]
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    held_out = batch(10**6, rank)
    with torch.no_grad():
        eval_loss = engine(**held_out)["loss"].item()  # no_grad: ORTModule's inference graph
    engine.eval()  # eval mode: the same graph, and dropout would be off
    with torch.no_grad():
        eval_mode_loss = engine(**held_out)["loss"].item()
    engine.train()

    offload = getattr(engine.optimizer, "parameter_offload", None)
    result = {
        "losses": losses,
        "eval_loss": eval_loss,
        "eval_mode_loss": eval_mode_loss,
        "ort_zero_hooks": hasattr(offload, "ort_zero_subscriber"),
    }
    if args.mode == "ort":
        manager = engine.module._torch_module._execution_manager(is_training=True)
        result["ort_session"] = manager._execution_agent is not None
        graph = manager._onnx_models.optimized_model.graph
        result["python_ops"] = sorted(
            {a.s.decode() for n in graph.node if n.op_type == "PythonOp" for a in n.attribute if a.name == "func_name"}
        )
    named = list(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in named], enabled=args.stage == 3):
        if rank == 0:
            result["params"] = {name: p.detach().double().flatten().tolist() for name, p in named}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    main()

"""Train a small Hugging Face causal LM with the Trainer and DeepSpeed ZeRO-3, in ONNX Runtime or PyTorch.

Any decoder type that `AutoModelForCausalLM.from_config` builds, at a small size, with a byte vocabulary (256) over
the stdlib corpus (no downloads). The job is an ordinary Trainer script; the one ORT-specific line is the choice of
`ORTZeroTrainer` (default) or `transformers.Trainer` (--no-ort, the same job in PyTorch). Under any launcher, e.g.:

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 -m ort_zero.examples.train_hf --model-type llama \\
        --deepspeed ds_configs/zero3_hf_auto.json --max-steps 20 --output-dir runs/hf

or `accelerate launch` with its DeepSpeed plugin (ZeRO stage 3) and no --deepspeed:

    DS_ACCELERATOR=cpu accelerate launch --config_file ds_configs/accelerate_zero3_cpu.yaml \
        -m ort_zero.examples.train_hf --model-type llama --max-steps 20 --output-dir runs/hf

Rank 0 writes to <output-dir>: `losses.csv` (step, the step's loss over its micro-batches and ranks, unrounded; grad
norm, learning rate, step time), `zero_init.json` (the model was partitioned as it was built), `result.json` (the
trained model's eval loss), `ort.json` (the ORT sessions and PythonOps that ran; not with --no-ort) and `model/`
(`trainer.save_model()`: loadable by `from_pretrained` without ORT or DeepSpeed). Checkpoints go to
<output-dir>/checkpoint-N with --save-steps; --resume continues from the newest complete one (--resume auto: if
there is one). On SIGTERM every rank saves the same step and the job exits 0 (ort_zero/integrations/preemption.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from deepspeed.accelerator import get_accelerator

from ort_zero import configs
from ort_zero.data import CorpusWindows, load_corpus
from ort_zero.disk_space import NotEnoughSpace
from ort_zero.distributed import shut_down_distributed
from ort_zero.examples.config import ConfigError, check_zero_stage, load_config
from ort_zero.examples.hf_models import build_model, numels
from ort_zero.examples.rank_run import UsageError, collective_timeout, configure_threads, start_process_group
from ort_zero.examples.resuming import add_resume_argument, trainer_checkpoint, trainer_deepspeed_config
from ort_zero.examples.step_losses import StepLosses
from ort_zero.foreign.transformers import attention_implementation
from ort_zero.integrations import preemption
from ort_zero.integrations.run_record import record_trainer

EVAL_WINDOWS = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ort_zero.examples.train_hf", description=__doc__.split("\n")[0])
    parser.add_argument("--model-type", default="llama", help="a causal LM type (llama, gpt2, ...)")
    parser.add_argument(
        "--deepspeed",
        type=configs.resolve,
        default=None,
        help="DeepSpeed ZeRO-3 config; 'auto' values allowed (not needed under accelerate's DeepSpeed plugin)",
    )
    parser.add_argument("--max-steps", type=int, default=20, help="optimizer steps in total (a resumed run included)")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/train_hf"))
    parser.add_argument("--record", type=Path, help="record each step here (ort-zero compare RUN_A RUN_B)")
    parser.add_argument("--no-ort", dest="ort", action="store_false", help="transformers.Trainer in PyTorch")
    parser.add_argument("--lora", action="store_true", help="train PEFT LoRA adapters; the base model stays frozen")
    parser.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: never)")
    add_resume_argument(parser)
    parser.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="a saved model (save_model's folder) to train on, via from_pretrained",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="the Trainer's option; in ORT ort_zero's layer-wise recompute of each decoder layer",
    )
    parser.add_argument(
        "--attn-implementation",
        default=None,
        help="eager, sdpa, ... (default: what from_pretrained gives, sdpa where the type has it)",
    )
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        default="fp32",
        help="TrainingArguments(bf16=True / fp16=True): the config's 'auto' precision sections follow",
    )
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=2, help="per rank and micro-batch")
    parser.add_argument(
        "--gradient-accumulation-steps", type=int, default=1, help="micro-batches per optimizer step (per rank)"
    )
    parser.add_argument("--hidden-size", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--local_rank", type=int, default=None, help="passed by the deepspeed launcher; unused")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """What can be checked before the process group exists."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if args.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UsageError(
            f"--model-type {args.model_type!r} is not a type AutoModelForCausalLM builds "
            "(e.g. llama, gpt2, gpt_neox, mistral, qwen2; all: transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)"
        )
    for name in ("max_steps", "seq_len", "batch_size", "gradient_accumulation_steps", "hidden_size", "layers", "heads"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.save_steps < 0:
        raise UsageError(f"--save-steps must be 0 or positive, got {args.save_steps}")
    if args.hidden_size % args.heads:
        raise UsageError(f"--hidden-size {args.hidden_size} must be a multiple of --heads {args.heads}")
    if args.deepspeed is not None:
        check_zero_stage(load_config(args.deepspeed), ort_zero_enabled=True, path=args.deepspeed)
    elif os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() not in ("1", "true", "yes"):
        raise UsageError(
            "--deepspeed <a ZeRO-3 config> is needed, unless accelerate launches with its DeepSpeed plugin"
        )


def trainer_class(ort: bool) -> type:
    """The job's Trainer: ORTZeroTrainer (the one changed line) or transformers.Trainer, recording step losses."""
    from transformers import Trainer

    from ort_zero.integrations.hf_trainer import ORTZeroTrainer

    return recording(ORTZeroTrainer if ort else Trainer)


def recording(base: type) -> type:
    """`base` (a Trainer class) recording every micro-batch's loss in its `step_losses`."""

    class RecordingTrainer(base):  # type: ignore[misc, valid-type]
        step_losses: StepLosses

        def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Any:
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.step_losses.add(loss)
            return loss

    return RecordingTrainer


def training_arguments(args: argparse.Namespace, **overrides: Any) -> Any:
    """An ordinary TrainingArguments with a DeepSpeed config; "auto" values in the config are filled from these.
    `overrides` replace or add TrainingArguments fields (evaluation and save strategies, optimizer, ...)."""
    from transformers import TrainingArguments

    fields: dict[str, Any] = dict(
        output_dir=str(args.output_dir),
        deepspeed=trainer_deepspeed_config(args.deepspeed, args.universal),  # None: accelerate's DeepSpeed plugin
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        adam_epsilon=1e-6,  # see ds_configs/README.md: 1e-8 turns float32 last-bit differences into lr-sized steps
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        activation_checkpointing=args.gradient_checkpointing,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        seed=args.seed,
        bf16=args.precision == "bf16",
        fp16=args.precision == "fp16",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=get_accelerator().device_name() == "cpu",  # else accelerate counts one process: see docs/huggingface.md
        enable_jit_checkpoint=True,  # SIGTERM: every rank saves the same step and stops (integrations/preemption.py)
    )
    return TrainingArguments(**{**fields, **overrides})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
        timeout = collective_timeout()
    except (UsageError, ConfigError, ValueError) as error:
        print(f"train_hf: error: {error}", file=sys.stderr)
        return 2
    os.environ.setdefault("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")  # an ORT failure must not run PyTorch
    configure_threads()
    rank, world_size = start_process_group("train_hf", timeout)  # before TrainingArguments (gloo, mpirun ranks)
    from ort_zero.integrations.hf_trainer import UnsupportedInORT

    training_args = training_arguments(args)  # first: a ZeRO-3 config then builds the model under zero.Init
    try:
        model, built = build_model(args)
        resume = trainer_checkpoint(args, world_size)
        step_losses = StepLosses(args.output_dir / "losses.csv", rank)
        trainer = trainer_class(args.ort)(
            model=model,
            args=training_args,
            train_dataset=CorpusWindows(args.seed, 64 * args.max_steps, args.seq_len, load_corpus()),
            eval_dataset=CorpusWindows(eval_seed(args.seed), EVAL_WINDOWS, args.seq_len, load_corpus()),
            data_collator=collate,
            callbacks=[step_losses],
        )
    except (UsageError, UnsupportedInORT) as error:
        print(f"train_hf: error (rank {rank}): {error}", file=sys.stderr)
        return 2
    trainer.step_losses = step_losses
    if args.record is not None:
        record_trainer(trainer, args.record)
    preemption.stop_on_sigterm(trainer)  # ORTZeroTrainer has it already; transformers.Trainer's JIT callback replaced
    if rank == 0:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        write_json(
            args.output_dir / "args.json", {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        )
    try:
        trainer.train(resume_from_checkpoint=resume)
    except NotEnoughSpace as error:  # raised on every rank before the checkpoint is written
        print(f"train_hf: error (rank {rank}): {error}", file=sys.stderr)
        return 1
    if preemption.stopped_at(trainer) is not None:
        return stop_preempted(args, trainer, rank)
    eval_loss = trainer.evaluate()["eval_loss"]
    trainer.save_model(str(args.output_dir / "model"))
    if rank == 0:
        record = {"model_type": args.model_type, "ort": args.ort, "lora": args.lora, "world_size": world_size}
        record.update(attn_implementation=attention_implementation(trainer.model))  # what the model runs
        record.update(trainer_world_size=training_args.world_size)  # the processes the Trainer shards batches over
        record.update(hf_gradient_checkpointing=getattr(model, "is_activation_checkpointing", False))
        record.update(eval_loss=eval_loss, eval_seed=eval_seed(args.seed), eval_windows=EVAL_WINDOWS)
        record.update(steps=trainer.state.global_step, **numels(model))
        write_json(args.output_dir / "result.json", record)
        write_json(args.output_dir / "zero_init.json", built)
        write_ort_record(args, trainer)
    shut_down_distributed()
    return 0


def stop_preempted(args: argparse.Namespace, trainer: Any, rank: int) -> int:
    """After SIGTERM: the checkpoint is written; exit 0 at once, within the launcher's grace period (no evaluation,
    no final model)."""
    if rank == 0:
        write_ort_record(args, trainer)
        step = preemption.stopped_at(trainer)
        print(f"train_hf: SIGTERM: saved checkpoint-{step} and stopped; continue with --resume", file=sys.stderr)
    shut_down_distributed()
    return 0


def write_ort_record(args: argparse.Namespace, trainer: Any) -> None:
    """`ort.json` (not with --no-ort): the ORT sessions and PythonOps that ran."""
    if args.ort:
        from ort_zero.ort.inspection import ort_run_record

        write_json(args.output_dir / "ort.json", ort_run_record(trainer.model_wrapped))


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The Trainer's default batching plus the attention mask a tokenizer gives (all ones: no window is padded).
    Without a mask, transformers 5 models look for packed sequences in the position ids with `torch.diff`, which
    ORT's TorchScript export cannot export (docs/huggingface.md)."""
    from transformers import default_data_collator

    batch = default_data_collator(items)
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    return batch


def eval_seed(seed: int) -> int:
    """The held-out windows' seed (the training windows use `seed` itself)."""
    return seed + 1


def write_json(path: Path, record: dict[str, Any]) -> None:
    path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""The checks transformers and accelerate run on their own DeepSpeed integration, as jobs of the example
(ort_zero.examples.train_hf: its arguments, model, data and loss recording), each trained one after the other in the
same ranks by `transformers.Trainer` (native DeepSpeed ZeRO-3), by `ORTZeroTrainer` and, where named, by
`transformers.Trainer` on ort_zero's hooks in PyTorch. Rank 0 writes <out>/checks.json: per run the per-step
losses, the eval loss, the Trainer state the job is about and, for ORT, the run record; `predict()`'s logits go to
<run>/predictions.pt, `save_model()` to <run>/model.

    torchrun --nproc_per_node 2 trainer_checks.py --out DIR [--jobs a,b]
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "ds_configs" / "zero3_hf_auto.json"
DS_SCHEDULER = {
    "type": "WarmupDecayLR",
    "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"},
}


def with_ds_scheduler(config: dict) -> dict:
    return {**config, "scheduler": DS_SCHEDULER}


def without_ds_optimizer(config: dict) -> dict:
    return {key: value for key, value in config.items() if key != "optimizer"}


def with_cpu_offload(config: dict) -> dict:
    zero = {**config["zero_optimization"], "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    return {**config, "zero_optimization": zero}


@dataclass
class Job:
    """A variant of the example's job: its command-line options, DeepSpeed config and TrainingArguments fields."""

    options: list[str] = field(default_factory=list)
    config: Callable[[dict], dict] = lambda config: config
    arguments: dict[str, Any] = field(default_factory=dict)
    modes: tuple[str, ...] = ("native", "ort")
    steps: int = 4


# load_best_model_at_end with greater_is_better=True on eval_loss: the "best" checkpoint is the first one (the loss
# falls), so the Trainer must load weights older than the last step's.
BEST_MODEL = dict(
    eval_strategy="steps",
    eval_steps=2,
    save_strategy="steps",
    save_steps=2,
    load_best_model_at_end=True,
    metric_for_best_model="eval_loss",
    greater_is_better=True,
)
JOBS = {
    "ds_optimizer+ds_scheduler": Job(config=with_ds_scheduler),
    "ds_optimizer+hf_scheduler": Job(),  # the project's config: DeepSpeed's AdamW, the Trainer's linear schedule
    "hf_optimizer+ds_scheduler": Job(config=lambda config: with_ds_scheduler(without_ds_optimizer(config))),
    "hf_optimizer+hf_scheduler": Job(config=without_ds_optimizer),
    "cpu_offload": Job(config=with_cpu_offload),
    "best_model": Job(arguments=BEST_MODEL, steps=6),
    "lora_checkpointing": Job(
        options=["--lora", "--gradient-checkpointing", "--learning-rate", "2e-2"],
        arguments=dict(activation_checkpointing_kwargs={"use_reentrant": False}),
        modes=("native", "hooks", "ort"),
    ),
}


def run(name: str, job: Job, mode: str, out: Path, rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from transformers import Trainer

    from ort_zero import api
    from ort_zero.data import CorpusWindows, load_corpus
    from ort_zero.examples import train_hf
    from ort_zero.examples.hf_models import build_model

    folder = out / name / mode
    config_path = out / name / "ds_config.json"
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        config_path.write_text(json.dumps(job.config(json.loads(CONFIG.read_text())), indent=1))
    dist.barrier()
    argv = ["--deepspeed", str(config_path), "--output-dir", str(folder), "--max-steps", str(job.steps), *job.options]
    args = train_hf.parse_args(argv)
    args.ort = mode == "ort"
    training_args = train_hf.training_arguments(args, **job.arguments)  # first: then zero.Init builds the model
    model, _ = build_model(args)
    if mode == "hooks":
        api.enable_zero3()
    step_losses = train_hf.StepLosses(folder / "losses.csv", rank)
    trainer_class = train_hf.recording(Trainer) if mode == "hooks" else train_hf.trainer_class(args.ort)
    trainer = trainer_class(
        model=model,
        args=training_args,
        train_dataset=CorpusWindows(args.seed, 64 * job.steps, args.seq_len, load_corpus()),
        eval_dataset=CorpusWindows(train_hf.eval_seed(args.seed), train_hf.EVAL_WINDOWS, args.seq_len, load_corpus()),
        data_collator=train_hf.collate,
        callbacks=[step_losses],
    )
    trainer.step_losses = step_losses
    trainer.train()
    result: dict[str, Any] = {"eval_loss": trainer.evaluate()["eval_loss"]}
    predictions = trainer.predict(trainer.eval_dataset)
    trainer.save_model(str(folder / "model"))
    state = trainer.state
    result.update(best_model_checkpoint=state.best_model_checkpoint, best_metric=state.best_metric)
    result.update(lr_scheduler=type(trainer.lr_scheduler).__name__, optimizer=_optimizer_name(trainer))
    result.update(learning_rates=[entry["learning_rate"] for entry in state.log_history if "learning_rate" in entry])
    result.update(hf_gradient_checkpointing=getattr(model, "is_activation_checkpointing", False))
    result.update(hooks=api.is_zero3_enabled(), offload=_offload_devices(trainer.model_wrapped))
    if args.ort:
        from ort_zero.ort.inspection import ort_run_record

        result["ort"] = ort_run_record(trainer.model_wrapped)
    if rank == 0:
        logits = torch.as_tensor(predictions.predictions)
        torch.save({"logits": logits, "metrics": predictions.metrics}, folder / "predictions.pt")
        with (folder / "losses.csv").open(newline="") as handle:
            result["losses"] = [float(row["loss"]) for row in csv.DictReader(handle)]
    trainer.accelerator.free_memory()
    del trainer, model
    gc.collect()
    api.disable_zero3()  # the next native run is DeepSpeed's own
    return result


def _optimizer_name(trainer: Any) -> str:
    """The optimizer that stepped: DeepSpeed's ZeRO-3 optimizer wraps the one the config or the Trainer made."""
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    inner = getattr(inner, "optimizer", inner)
    return type(inner).__name__


def _offload_devices(engine: Any) -> dict[str, str | None]:
    """Where DeepSpeed's engine keeps optimizer states and parameters (None: on the accelerator)."""
    devices = {"optimizer": engine.zero_offload_optimizer(), "param": engine.zero_offload_param()}
    return {
        key: None if offload is None else getattr(offload.device, "value", offload.device)
        for key, offload in devices.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", default=",".join(JOBS))
    args = parser.parse_args()

    from ort_zero.distributed import init_distributed, shut_down_distributed
    from ort_zero.examples.rank_run import configure_threads

    configure_threads()
    rank, _ = init_distributed()
    results: dict[str, Any] = {}
    for name in args.jobs.split(","):
        for mode in JOBS[name].modes:
            results[f"{name}/{mode}"] = run(name, JOBS[name], mode, args.out, rank)
    if rank == 0:
        (args.out / "checks.json").write_text(json.dumps(results, indent=1) + "\n")
    shut_down_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())

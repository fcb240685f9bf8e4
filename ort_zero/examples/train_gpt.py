"""Train the repository's small GPT on the stdlib byte corpus with DeepSpeed ZeRO-3, in ONNX Runtime or PyTorch.

Runs under any launcher (see launch/*.sh), e.g. two CPU ranks:

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 -m ort_zero.examples.train_gpt \\
        --deepspeed_config ds_configs/zero3_cpu_fp32.json --steps 20 --output-dir runs/demo

Modes: --ort (default) wraps the model in ORTModule and routes ZeRO-3 through ort_zero; --no-ort keeps ort_zero's
hooks in PyTorch; --native is plain DeepSpeed without ort_zero, the reference the other two are compared against.
--gradient-checkpointing recomputes each block in the backward. Rank 0 writes `<output-dir>/losses.csv` (step, global
mean loss, step time), `args.json` (with --ort, the ORTMODULE_MEMORY_OPT_LEVEL the run saw) and, with --ort, `ort.json`
(the ORT sessions and PythonOps that ran, and what ort_zero recomputed). ORT_ZERO_COLLECTIVE_TIMEOUT (seconds,
default 600) bounds how long a rank waits for the others; a rank that loses contact with another says so and exits 1.
On SIGTERM every rank saves a checkpoint at the end of the same step (in <output-dir>/checkpoints) and exits 0.
--record DIR writes each step's loss, gradients and parameters there, for `ort-zero compare` (integrations.run_record).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from tqdm import tqdm

import ort_zero
from ort_zero import configs, settings
from ort_zero.data import load_corpus, sample_batch, step_seed
from ort_zero.disk_space import NotEnoughSpace, deepspeed_checkpoint_bytes, require_space
from ort_zero.distributed import shut_down_distributed
from ort_zero.examples.config import ConfigError, check_batch, check_zero_stage, load_config
from ort_zero.examples.loss_log import LossLog
from ort_zero.examples.rank_run import (
    LOST_CONTACT_EXIT,
    UsageError,
    collective_timeout,
    configure_threads,
    lost_contact,
    report_lost_contact,
    start_process_group,
)
from ort_zero.examples.resuming import (
    ALWAYS,
    add_resume_argument,
    check_saved_ranks,
    check_universal,
    readable_tag,
    universal_loading,
)
from ort_zero.integrations.run_record import record_engine
from ort_zero.models import GPT, GPTConfig
from ort_zero.sigterm import StopRequest

FALLBACK_ENV = "ORTMODULE_FALLBACK_POLICY"


@dataclass
class Trainer:
    """One rank's training state: the engine and what it needs to draw this rank's batches."""

    engine: Any  # deepspeed.DeepSpeedEngine
    args: argparse.Namespace
    rank: int
    world_size: int
    corpus: torch.Tensor
    current_step: int | None = None  # the step being trained, for error messages

    @property
    def checkpoint_dir(self) -> Path:
        return self.args.output_dir / "checkpoints"

    def step(self, step: int) -> float:
        """One optimizer step (all its micro-batches); returns the loss averaged over micro-batches and ranks."""
        accumulation = self.engine.gradient_accumulation_steps()
        total = torch.zeros((), dtype=torch.float64)
        for micro in range(accumulation):
            # Keyed by the global micro-step: a resumed run draws the dropout masks it would have.
            torch.manual_seed(step_seed(self.args.seed, step * accumulation + micro, self.rank))
            # The step's global batch depends on the step alone: a run resumed on another number of ranks, with
            # gradient accumulation making up the difference, trains on the same windows.
            batch = sample_batch(
                self.args.seed, step, micro * self.world_size + self.rank, self.world_size * accumulation,
                self.engine.train_micro_batch_size_per_gpu(), self.args.seq_len, self.corpus,
            )  # fmt: skip
            loss = self.engine(**{k: v.to(self.engine.device) for k, v in batch.items()})["loss"]
            self.engine.backward(loss)
            self.engine.step()
            total += loss.detach().double().cpu()
        dist.all_reduce(total)
        return total.item() / (accumulation * self.world_size)

    def save(self, next_step: int) -> None:
        """Every rank writes its ZeRO partition; `next_step` is where a resumed run starts."""
        needed = deepspeed_checkpoint_bytes(self.checkpoint_dir, self.engine.module)
        require_space(self.checkpoint_dir, needed, f"the checkpoint of step {next_step}")  # on every rank, or none
        self.engine.save_checkpoint(str(self.checkpoint_dir), client_state={"next_step": next_step})

    def resume(self) -> int:
        """Load the latest checkpoint if there is one; the step to start from (0 without one)."""
        if not (self.checkpoint_dir / "latest").is_file():
            if self.rank == 0:
                print(f"train_gpt: no checkpoint in {self.checkpoint_dir}; starting at step 0", file=sys.stderr)
            return 0
        load_path, client_state = self.engine.load_checkpoint(str(self.checkpoint_dir), tag=self.args.resume_tag)
        if load_path is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint in {self.checkpoint_dir}")
        return int(client_state["next_step"])

    def run(self, start: int, stop: StopRequest) -> int | None:
        """Train from `start`; the step after which every rank saved and stopped on SIGTERM (None: all steps ran)."""
        log = LossLog(self.args.output_dir / "losses.csv", start) if self.rank == 0 else None
        bar = tqdm(total=self.args.steps, initial=start, desc="train", disable=self.rank != 0, dynamic_ncols=True)
        for step in range(start, self.args.steps):
            self.current_step = step
            began = time.perf_counter()
            loss = self.step(step)
            elapsed_ms = (time.perf_counter() - began) * 1000.0
            if log is not None:
                log.append(step, loss, elapsed_ms)
            bar.set_postfix(loss=f"{loss:.4f}")
            bar.update()
            done = step + 1
            if stop.agreed():  # every rank, at every step's end: any rank's SIGTERM stops them all here
                self.save(done)
                bar.close()
                return done
            if self.args.save_every and (done % self.args.save_every == 0 or done == self.args.steps):
                self.save(done)
        bar.close()
        self.current_step = None
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ort_zero.examples.train_gpt", description=__doc__.split("\n")[0])
    parser.add_argument("--deepspeed_config", type=configs.resolve, required=True, help="DeepSpeed JSON config")
    parser.add_argument(
        "--ort",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap the model in ORTModule (default, except with --native)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="plain DeepSpeed in PyTorch without ort_zero: the reference run (any ZeRO stage)",
    )
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total (a resumed run included)")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute each block in the backward (torch.utils.checkpoint in PyTorch runs; under --ort, ort_zero's "
        "layer-wise recompute takes its place: set ORTMODULE_MEMORY_OPT_LEVEL=1 or 2)",
    )
    parser.add_argument("--output-dir", type=Path, default=Path("runs/train_gpt"))
    parser.add_argument("--record", type=Path, help="record each step here (ort-zero compare RUN_A RUN_B)")
    parser.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps and at the end (0: never)")
    add_resume_argument(parser)
    parser.add_argument("--local_rank", type=int, default=None, help="passed by the deepspeed launcher; unused")
    args = parser.parse_args(argv)
    if args.ort is None:
        args.ort = not args.native
    return args


def check_args(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that can be checked before the process group exists; returns the loaded DeepSpeed config."""
    if args.native and args.ort:
        raise UsageError("--native runs plain DeepSpeed in PyTorch; it cannot be combined with --ort")
    if args.native and ort_zero.is_zero3_enabled():
        raise UsageError("--native skips ort_zero, but ORTMODULE_ENABLE_ZERO_STAGE3=1 enabled it; unset the variable")
    for name in ("steps", "seq_len", "n_layer", "n_head", "d_model"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    check_universal(args)
    if args.resume == ALWAYS and not (args.output_dir / "checkpoints" / "latest").is_file():
        raise UsageError(f"--resume: no checkpoint in {args.output_dir / 'checkpoints'}; --resume auto starts anew")
    if args.save_every < 0:
        raise UsageError(f"--save-every must be 0 or positive, got {args.save_every}")
    if not 0.0 <= args.dropout < 1.0:
        raise UsageError(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.d_model % args.n_head:
        raise UsageError(f"--d-model {args.d_model} must be a multiple of --n-head {args.n_head}")
    if args.ort:
        try:
            settings.recompute_level()  # ORTMODULE_MEMORY_OPT_LEVEL, read again by ort_zero's graph passes
        except ValueError as error:
            raise UsageError(str(error)) from None
    config = load_config(args.deepspeed_config)
    check_zero_stage(config, ort_zero_enabled=not args.native, path=args.deepspeed_config)
    if "optimizer" not in config:
        raise ConfigError(
            f'{args.deepspeed_config}: no "optimizer" block; this trainer lets DeepSpeed build it '
            "(see ds_configs/zero3_cpu_fp32.json)"
        )
    return universal_loading(config) if args.universal else config


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    """The same initial weights on every rank (seeded here); wrapped in ORTModule for --ort."""
    torch.manual_seed(args.seed)
    model: torch.nn.Module = GPT(
        GPTConfig(n_layer=args.n_layer, n_head=args.n_head, d_model=args.d_model, max_seq=args.seq_len,
                  dropout=args.dropout, gradient_checkpointing=args.gradient_checkpointing)
    )  # fmt: skip
    if args.ort:
        os.environ.setdefault(FALLBACK_ENV, "FALLBACK_DISABLE")  # a failure in ORT must not silently run PyTorch
        try:
            from onnxruntime.training.ortmodule import ORTModule
        except ImportError as error:
            raise UsageError(f"--ort needs onnxruntime-training ({error}); run with --no-ort or install it") from None
        model = ORTModule(model)
    return model


def write_args(args: argparse.Namespace, world_size: int) -> None:
    record = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    record.update(world_size=world_size, ort_zero=ort_zero.__version__, ort_zero_enabled=not args.native)
    record["memory_opt_level"] = settings.recompute_level() if args.ort else None  # what ort_zero's passes read
    (args.output_dir / "args.json").write_text(json.dumps(record, indent=1) + "\n")


def write_ort_record(engine: Any, output_dir: Path) -> None:
    """`ort.json`: the ORT sessions and PythonOps this rank's model ran, evidence that --ort really ran in ORT."""
    from ort_zero.ort.inspection import ort_run_record

    (output_dir / "ort.json").write_text(json.dumps(ort_run_record(engine.module), indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = check_args(args)
        timeout = collective_timeout()
    except (UsageError, ConfigError) as error:
        print(f"train_gpt: error: {error}", file=sys.stderr)
        return 2
    configure_threads()
    if not args.native:
        ort_zero.enable_zero3()  # before ORTModule and deepspeed.initialize
    rank, world_size = start_process_group("train_gpt", timeout)
    try:
        check_batch(config, world_size, args.deepspeed_config)
        if args.resume:  # a damaged newest checkpoint is skipped (resume_tag), said in one line
            args.resume_tag = (
                None if args.universal else readable_tag(args.output_dir / "checkpoints", "train_gpt", rank)
            )
            check_saved_ranks(args.output_dir / "checkpoints", world_size, args.universal)
        model = build_model(args)
    except (UsageError, ConfigError) as error:
        print(f"train_gpt: error (rank {rank}): {error}", file=sys.stderr)
        return 2
    if rank == 0:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        write_args(args, world_size)
    trainer: Trainer | None = None
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        if args.record is not None:
            record_engine(engine, args.record)
        trainer = Trainer(engine=engine, args=args, rank=rank, world_size=world_size, corpus=load_corpus())
        start = trainer.resume() if args.resume else 0
        with StopRequest() as stop:  # SIGTERM noted, not fatal: run() saves and stops where every rank agrees
            stopped_at = trainer.run(start, stop)
        if args.ort and rank == 0:
            write_ort_record(engine, args.output_dir)
        if stopped_at is not None and rank == 0:
            print(f"train_gpt: SIGTERM: saved step {stopped_at} and stopped; continue with --resume", file=sys.stderr)
        shut_down_distributed()
    except NotEnoughSpace as error:
        print(f"train_gpt: error (rank {rank}): {error}", file=sys.stderr)
        return 1
    except RuntimeError as error:
        if not lost_contact(error):
            raise
        report_lost_contact("train_gpt", error, rank, trainer.current_step if trainer else None)
        return LOST_CONTACT_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One rank of `bench_real_size.py`: the Trainer job a user writes at a realistic size, with its clock and memory read.

A LLaMA-shaped causal LM from config (vocab 32000, the attention implementation transformers picks), random token
ids with an all-ones attention mask, micro-batch 1, AdamW from the project's ZeRO-3 config; `transformers.Trainer`
(native DeepSpeed ZeRO-3) or `ORTZeroTrainer` (the one line a user changes). Writes `<out>/<mode>-rank<R>.json`: per
step its wall time and CPU time (user, system), loss, grad norm, the RSS and the live heap at its end, the pages
faulted in by its forward, backward and optimizer step (DeepSpeed's engine calls, timed around); RSS sampled
every 50 ms (for the plot); the process's peak RSS; under ORT, ORT's first-step phases (export, graph builder, graph
build, session creation).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / 2**20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks "
                "fordblks keepcost".split()]  # fmt: skip


def malloced_mib() -> float | None:
    """MiB malloc has handed out and not had back after a garbage collection (glibc's mallinfo2); None elsewhere.
    (`ort_zero.memory.footprint.malloced_bytes` reads the same; the native run must not import ort_zero.)"""
    mallinfo2 = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _Mallinfo2
    gc.collect()
    info = mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


class RssSampler(threading.Thread):
    """(seconds since start, RSS MiB) every `interval` seconds, from a daemon thread."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.interval, self.start_time, self.samples = interval, time.perf_counter(), []

    def run(self) -> None:
        while True:
            self.samples.append((round(time.perf_counter() - self.start_time, 3), round(rss_mib(), 1)))
            time.sleep(self.interval)


class PhaseFaults:
    """Pages faulted in, and wall seconds, per step in the DeepSpeed engine's forward, backward and optimizer step:
    where a step's system time goes when freed memory handed back to the OS is used again (docs/benchmarks.md), and
    which phase a slower step is slower in."""

    PHASES = {"forward": "forward", "backward": "backward", "step": "optimizer"}

    def __init__(self) -> None:
        self.faults = dict.fromkeys(self.PHASES.values(), 0)
        self.seconds = dict.fromkeys(self.PHASES.values(), 0.0)

    def count(self, engine_class: type) -> None:
        for method, phase in self.PHASES.items():
            setattr(engine_class, method, self._counted(getattr(engine_class, method), phase))

    def _counted(self, method: Any, phase: str) -> Any:
        def counted(engine: Any, *args: Any, **kwargs: Any) -> Any:
            before, began = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            try:
                return method(engine, *args, **kwargs)
            finally:
                self.faults[phase] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
                self.seconds[phase] += time.perf_counter() - began

        return counted

    def take(self) -> tuple[dict[str, int], dict[str, float]]:
        taken = self.faults, self.seconds
        self.faults, self.seconds = dict.fromkeys(self.PHASES.values(), 0), dict.fromkeys(self.PHASES.values(), 0.0)
        return taken


def ort_phases(model: Any) -> dict[str, float]:
    """Seconds ORT spent in each phase of its first training step (its own TimeTracker)."""
    from ort_zero.foreign import onnxruntime as ort_internals

    return ort_internals.first_step_phases(getattr(model, "module", model))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["native", "ort"], required=True)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--experts", type=int, default=0, help="> 0: a Qwen3-MoE with this many experts per layer")
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="TrainingArguments(bf16=...)")
    parser.add_argument("--deepspeed", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--record", type=Path, help="also record the run (integrations.run_record): what recording costs"
    )
    parser.add_argument("--local_rank", type=int, default=None)
    args = parser.parse_args()

    sampler = RssSampler()
    sampler.start()
    if args.mode == "ort":
        import ort_zero  # noqa: F401  (before ORTModule: torch.onnx compatibility)
    import torch
    import torch.distributed as dist
    from transformers import (
        AutoModelForCausalLM,
        LlamaConfig,
        Qwen3MoeConfig,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.usage_before = resource.getrusage(resource.RUSAGE_SELF)
            self.began = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            seconds, rss, usage = time.perf_counter() - self.began, rss_mib(), resource.getrusage(resource.RUSAGE_SELF)
            before = self.usage_before
            step = {
                "began_s": self.began - sampler.start_time,  # on the RSS samples' clock: peaks per step
                "seconds": seconds,
                "user_s": usage.ru_utime - before.ru_utime,  # the process's own work, every thread
                "sys_s": usage.ru_stime - before.ru_stime,  # the kernel's for it: page faults, collectives' I/O
                "rss_mib": rss,
                "malloced_mib": malloced_mib(),
                "minor_faults": usage.ru_minflt - before.ru_minflt,  # pages touched afresh
            }
            step["faults_by_phase"], step["seconds_by_phase"] = phase_faults.take()
            self.steps.append(step)

    import deepspeed
    from deepspeed.runtime.engine import DeepSpeedEngine

    phase_faults = PhaseFaults()
    phase_faults.count(DeepSpeedEngine)
    deepspeed.init_distributed("nccl" if torch.cuda.is_available() else "gloo")  # before TrainingArguments (CPU)
    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="bench_real_size_"),
        per_device_train_batch_size=1,
        max_steps=args.steps,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        deepspeed=str(args.deepspeed),
        use_cpu=not torch.cuda.is_available(),
        seed=1234,
        disable_tqdm=True,
        activation_checkpointing=args.activation_checkpointing,
        bf16=args.precision == "bf16",
    )
    sizes = {
        "vocab_size": args.vocab, "hidden_size": args.hidden, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "max_position_embeddings": args.seq_len,
    }  # fmt: skip
    if args.experts:  # Qwen3-MoE-shaped: every layer's MLP is experts (transformers' default implementation)
        config = Qwen3MoeConfig(
            **sizes, num_key_value_heads=args.heads, num_experts=args.experts, num_experts_per_tok=args.top_k,
            moe_intermediate_size=args.intermediate, intermediate_size=args.intermediate, decoder_sparse_step=1,
        )  # fmt: skip
    else:
        config = LlamaConfig(**sizes, intermediate_size=args.intermediate)
    set_seed(1234)  # the same initial weights in both modes
    model = AutoModelForCausalLM.from_config(config)  # under zero.Init: TrainingArguments carry a ZeRO-3 config
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.steps * 2, args.seq_len), generator=generator)
    # With the attention mask a tokenizer gives (without one, transformers 5 looks for packed sequences with
    # aten::diff, which the TorchScript exporter cannot export: issue 24).
    dataset = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row} for row in ids]
    if args.mode == "ort":
        from ort_zero.integrations.hf_trainer import ORTZeroTrainer

        trainer_class = ORTZeroTrainer
    else:
        trainer_class = Trainer
    clock = StepClock()
    trainer = trainer_class(model=model, args=training_args, train_dataset=dataset, callbacks=[clock])
    rss_before = rss_mib()
    if args.record is not None:  # imports ort_zero: a native run recorded is no longer free of it
        from ort_zero.integrations.run_record import record_trainer

        record_trainer(trainer, args.record)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    rank = int(os.environ.get("RANK", "0"))
    result = {
        "mode": args.mode,
        "rank": rank,
        "parameters": sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()),
        "attn_implementation": model.config._attn_implementation,
        "experts_implementation": getattr(model.config, "_experts_implementation", None) if args.experts else None,
        "seq_len": args.seq_len,
        "activation_checkpointing": args.activation_checkpointing,
        "precision": args.precision,
        "parameter_dtype": str(next(model.parameters()).dtype),
        "rss_before_train_mib": rss_before,
        "steps": [
            {**step, "loss": log["loss"], "grad_norm": log.get("grad_norm")}
            for step, log in zip(clock.steps, logs, strict=True)
        ],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_samples": sampler.samples,
        "ort_phases": ort_phases(trainer.model_wrapped) if args.mode == "ort" else {},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.mode}-rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(0.2)  # gloo's workers finish with the GIL free (ort_zero.distributed.shut_down_distributed says why)


if __name__ == "__main__":
    main()

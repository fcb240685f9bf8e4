"""One rank of `bench_zero3.py`: train for warm-up + measured steps, write step times and memory to JSON."""

from __future__ import annotations

import argparse
import cProfile
import json
import resource
import threading
import time
import tracemalloc
from pathlib import Path

import deepspeed
import psutil
import torch
import torch.nn.functional as F
from torch import nn

from ort_zero.distributed import shut_down_distributed
from ort_zero.models.stack import RELEASE_EARLY_ZERO3, LinearStack


class WideMLP(nn.Module):
    """Parameters (and so gradients) dominate memory: 4 x (2048 x 2048) weights, small activations."""

    def __init__(self, width: int = 2048, depth: int = 4, vocab: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + F.gelu(layer(h))
        return {"loss": F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())}


class PeakRss:
    """Samples this process's RSS every millisecond while active: the peak inside the measured steps."""

    def __init__(self) -> None:
        self.process, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.001)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["native", "torch", "ort"], required=True)
    parser.add_argument("--stage", type=int, default=3)
    parser.add_argument("--mem-grads", action="store_true")
    parser.add_argument("--model", choices=["gpt", "mlp", "stack"], default="gpt")
    parser.add_argument("--depth", type=int, default=16, help="layers of the stack model")
    parser.add_argument("--n-layer", type=int, default=4, help="blocks of the GPT")
    parser.add_argument("--seq-len", type=int, default=128, help="GPT sequence length")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="GPT: torch.utils.checkpoint per block")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", action="store_true", help="cProfile the measured steps (rank0.pstats)")
    args = parser.parse_args()
    if args.gradient_checkpointing and args.model != "gpt":
        parser.error("--gradient-checkpointing is an option of the GPT")

    if args.mode != "native":
        import ort_zero

        ort_zero.enable_zero3(mem_efficient_grads=args.mem_grads)
    from ort_zero.distributed import init_distributed

    rank, _ = init_distributed()
    torch.manual_seed(0)
    # The stack is released as early as DeepSpeed allows: the memory measured is what the hooks keep.
    zero_config = dict(RELEASE_EARLY_ZERO3, stage=args.stage) if args.model == "stack" else {"stage": args.stage}
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "zero_optimization": zero_config,
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    if args.model == "gpt":
        from ort_zero.models.gpt import GPT, GPTConfig

        model: nn.Module = GPT(
            GPTConfig(vocab_size=256, n_layer=args.n_layer, n_head=4, d_model=256, max_seq=args.seq_len,
                      gradient_checkpointing=args.gradient_checkpointing)
        )  # fmt: skip
        seq = args.seq_len
    elif args.model == "mlp":
        model, seq = WideMLP(), 16
    else:
        with deepspeed.zero.Init(config_dict_or_path=config, enabled=args.stage == 3):  # partitioned when built
            model, seq = LinearStack(depth=args.depth), 16
    if args.mode == "ort":
        from onnxruntime.training.ortmodule import ORTModule

        model = ORTModule(model)
    # The stack measures what forward and backward hold: SGD, since Adam's step allocates temporaries for all
    # partitions at once, a peak that would hide it.
    optimizer_class = torch.optim.SGD if args.model == "stack" else torch.optim.Adam
    optimizer = optimizer_class(model.parameters(), lr=1e-4)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    generator = torch.Generator().manual_seed(rank)

    losses = []

    def forward() -> torch.Tensor:
        if args.model == "stack":
            return engine(torch.randn(args.micro_batch, seq, 2048, generator=generator).to(engine.device))
        ids = torch.randint(0, 256, (args.micro_batch, seq + 1), generator=generator)
        return engine(input_ids=ids[:, :-1].to(engine.device), labels=ids[:, 1:].to(engine.device))["loss"]

    def step() -> float:
        start = time.perf_counter()
        loss = forward()
        engine.backward(loss)
        engine.step()
        elapsed = (time.perf_counter() - start) * 1000
        losses.append(loss.item())
        return elapsed

    start = psutil.Process().memory_info().rss  # model built and partitioned; no step, no ORT session yet
    for _ in range(args.warmup):
        step()
    before = psutil.Process().memory_info().rss
    on_gpu = engine.device.type == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    profiler = cProfile.Profile() if args.profile and rank == 0 else None
    tracemalloc.start()
    with PeakRss() as sampler:
        if profiler is not None:
            profiler.enable()
        times = [step() for _ in range(args.steps)]
        if profiler is not None:
            profiler.disable()
    result = {
        "step_ms": times,
        "losses": losses,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # export and warm-up included
        "step_peak_rss_mib": sampler.peak / 2**20,
        # What training adds to the built model (activations, gradients, optimizer state, ORT's session and arena):
        # the libraries a process loaded (ORT's are larger) cancel out.
        "peak_above_start_mib": (sampler.peak - start) / 2**20,
        "step_rss_growth_mib": (sampler.peak - before) / 2**20,
        # Python objects only: torch's CPU allocator (tensor storage) bypasses tracemalloc.
        "python_peak_mib": tracemalloc.get_traced_memory()[1] / 2**20,
        "gpu_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if on_gpu else None,
    }
    tracemalloc.stop()
    if args.mode == "ort":  # a benchmark of a silent PyTorch fallback would measure the wrong thing
        from ort_zero.ort.inspection import ort_run_record

        training = ort_run_record(engine.module)["training"]
        assert training["session"], "ORT has no training session: the steps ran in PyTorch"
        if args.stage == 3:  # what ort_zero's layer-wise recompute of ZeRO-3 graphs did; None: no record of it
            result["recompute"] = training.get("recompute")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(result))
    if profiler is not None:
        profiler.dump_stats(args.out / "rank0.pstats")
    shut_down_distributed()


if __name__ == "__main__":
    main()

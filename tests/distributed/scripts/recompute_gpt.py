"""Train the small GPT with ZeRO-3 on this rank: native DeepSpeed (optionally checkpointing every block with
torch.utils.checkpoint) or in ORT through ort_zero at a recompute level. Writes `<out>/rank<r>.json`: per step the
loss, the RSS the forward left allocated (what is held for the backward: activations and gathered parameters;
run with MALLOC_MMAP_THRESHOLD_ low so that freed tensors leave RSS) and the RSS above the first step's start that
the optimizer step begins on, the step peak, the last step's reduced
gradients, the final parameters, ORT's run record and, in ORT, what ORTModule keeps besides its session."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import deepspeed
import psutil
import torch
import torch.utils.checkpoint
from deepspeed.utils import safe_get_full_grad
from onnx import ModelProto
from rank_run import finish, start, write_result

from ort_zero.memory.footprint import malloced_bytes
from ort_zero.models.gpt import GPT, GPTConfig
from ort_zero.models.stack import RELEASE_EARLY_ZERO3


class RssPeak:
    """How far RSS rises above where it was when started, sampled every millisecond in a thread."""

    def __init__(self, process: psutil.Process) -> None:
        self.process, self.base, self.peak, self.done = process, 0, 0, threading.Event()

    def start(self) -> None:
        self.base = self.peak = self.process.memory_info().rss
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(0.001):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return (self.peak - self.base) / 2**20


def what_ortmodule_keeps(engine: deepspeed.DeepSpeedEngine) -> dict[str, object]:
    """Besides its session, after training: the bytes ORTModule's kept graphs (exported, processed, optimized) hold,
    measured by dropping them, against their serialized size; whether the
    graph builder and the session's copy of the model bytes are still there."""
    manager = engine.module._torch_module._execution_manager(True)
    transitions = manager._graph_transition_manager
    holders = [
        (manager._onnx_models, "optimized_model"),
        (transitions._exported_model_info, "exported_model"),
        (transitions._post_export_processed_model_info, "_post_export_processed_model"),
    ]
    models: list[ModelProto] = [getattr(holder, name) for holder, name in holders]
    serialized = sum(model.ByteSize() for model in models)
    del models
    before = malloced_bytes()
    for holder, name in holders:
        setattr(holder, name, None)
    return {
        "graph_bytes": before - malloced_bytes(),
        "serialized_bytes": serialized,
        "graph_builder": manager._graph_builder is not None,
        "session_model_bytes": manager._execution_agent._inference_session._model_bytes is not None,
    }


def checkpoint_blocks(model: GPT) -> None:
    """Run each block under torch.utils.checkpoint (non-reentrant), as PyTorch users turn on checkpointing."""
    for block in model.blocks:
        forward = block.forward
        block.forward = lambda x, forward=forward: torch.utils.checkpoint.checkpoint(forward, x, use_reentrant=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["native", "native-ckpt", "ort"], required=True)
    parser.add_argument("--level", type=int, default=0, help="ort: ort_zero's recompute level")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    rank = start(args.mode)
    if args.mode == "ort":
        from ort_zero import settings

        settings.recompute_level_override = args.level
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "zero_optimization": RELEASE_EARLY_ZERO3,
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    torch.manual_seed(0)
    gpt_config = GPTConfig(n_layer=args.layers, d_model=256, n_head=4, max_seq=args.seq, dropout=args.dropout)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = GPT(gpt_config)
    if args.mode == "native-ckpt":
        checkpoint_blocks(model)
    if args.mode == "ort":
        from onnxruntime.training.ortmodule import ORTModule

        model = ORTModule(model)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config)
    process = psutil.Process()
    held_mib, optimizer_step_mib, losses, peak = [], [], [], RssPeak(process)
    start_rss = process.memory_info().rss
    for step in range(args.steps):
        if step == 1:  # the first step exports the model and builds ORT's session
            peak.start()
        ids = torch.randint(
            0, 256, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(step * 7 + rank)
        )
        before = process.memory_info().rss
        loss = engine(input_ids=ids[:, :-1], labels=ids[:, 1:])["loss"]
        held_mib.append((process.memory_info().rss - before) / 2**20)
        engine.backward(loss)
        if step == args.steps - 1:  # the gradients DeepSpeed reduced (before the step), per parameter in model order
            grads = [safe_get_full_grad(param).flatten()[:64].tolist() for param in engine.module.parameters()]
        optimizer_step_mib.append((process.memory_info().rss - start_rss) / 2**20)
        engine.step()
        losses.append(loss.item())
    params = []  # in model order: ORTModule prefixes the names
    for param in engine.module.parameters():
        with deepspeed.zero.GatheredParameters([param]):
            params.append(param.detach().flatten()[:64].tolist())
    result = {"held_mib": held_mib, "optimizer_step_mib": optimizer_step_mib, "step_peak_mib": peak.stop()}
    result |= {"losses": losses, "params": params, "grads": grads}
    if args.mode == "ort":
        from ort_zero.ort.inspection import ort_run_record

        result["ort"] = ort_run_record(engine.module)
        result["kept"] = what_ortmodule_keeps(engine)  # drops the graphs: after the run record, which reads them
    write_result(args.out, rank, result)
    finish()


if __name__ == "__main__":
    main()

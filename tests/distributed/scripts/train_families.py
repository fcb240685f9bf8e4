"""Each model family named on the command line, tiny from config, trained by `transformers.Trainer` (native
DeepSpeed ZeRO-3) and by `ORTZeroTrainer` one after the other in the same ranks: the example's own job
(ort_zero.examples.train_hf: its arguments, model, data, Trainer and loss recording), once per family, attention
implementation and trainer. Rank 0 writes <out>/families.json: per run the per-step losses, the attention
implementation the model ran and, for ORT, the run record.

    torchrun --nproc_per_node 2 train_families.py --out DIR --families qwen3,olmo2 --attn default,eager --steps 3
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "ds_configs" / "zero3_hf_auto.json"


def run(family: str, attn: str, ort: bool, out: Path, steps: int, rank: int) -> dict[str, Any]:
    from ort_zero import api
    from ort_zero.data import CorpusWindows, load_corpus
    from ort_zero.examples import train_hf
    from ort_zero.examples.hf_models import build_model
    from ort_zero.foreign.transformers import attention_implementation

    folder = out / f"{family}-{attn}-{'ort' if ort else 'native'}"
    argv = ["--model-type", family, "--deepspeed", str(CONFIG), "--output-dir", str(folder), "--max-steps", str(steps)]
    argv += [] if attn == "default" else ["--attn-implementation", attn]
    args = train_hf.parse_args(argv)
    training_args = train_hf.training_arguments(args)  # first: the model is then built under zero.Init
    model, built = build_model(args)
    step_losses = train_hf.StepLosses(folder / "losses.csv", rank)
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    trainer = train_hf.trainer_class(ort)(
        model=model,
        args=training_args,
        train_dataset=CorpusWindows(args.seed, 64 * steps, args.seq_len, load_corpus()),
        data_collator=train_hf.collate,
        callbacks=[step_losses],
    )
    trainer.step_losses = step_losses
    trainer.train()
    result: dict[str, Any] = {"attn_implementation": attention_implementation(model), "partitioned": built}
    result["hooks"] = api.is_zero3_enabled()
    if ort:
        from ort_zero.ort.inspection import ort_run_record

        result["ort"] = ort_run_record(trainer.model_wrapped)["training"]
    if rank == 0:
        with (folder / "losses.csv").open(newline="") as handle:
            result["losses"] = [float(row["loss"]) for row in csv.DictReader(handle)]
    trainer.accelerator.free_memory()
    del trainer, model
    gc.collect()
    api.disable_zero3()  # ORTZeroTrainer enabled ort_zero's hooks: the next native run is DeepSpeed's own
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", required=True)
    parser.add_argument("--attn", default="default,eager")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    from ort_zero.distributed import init_distributed, shut_down_distributed
    from ort_zero.examples.rank_run import configure_threads

    configure_threads()
    rank, _ = init_distributed()
    results: dict[str, Any] = {}
    for family in args.families.split(","):
        for attn in args.attn.split(","):
            for ort in (False, True):
                results[f"{family}/{attn}/{'ort' if ort else 'native'}"] = run(
                    family, attn, ort, args.out, args.steps, rank
                )
    if rank == 0:
        (args.out / "families.json").write_text(json.dumps(results, indent=1) + "\n")
    shut_down_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())

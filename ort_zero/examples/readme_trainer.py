"""The README's Hugging Face Trainer recipe as a user writes it, on CPU: `init_distributed()`, TrainingArguments
with `use_cpu=True` and a ZeRO-3 config, a tiny LLaMA from config at its defaults, `ORTZeroTrainer`, and no
shut-down at the end (ort_zero ends the process group at exit). Under a launcher, e.g.:

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 -m ort_zero.examples.readme_trainer --output-dir runs/readme

Rank 0 writes <output-dir>/result.json: the per-step losses and whether ORT ran the training graph.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, TrainingArguments

from ort_zero import configs
from ort_zero.data import CorpusWindows, load_corpus
from ort_zero.distributed import init_distributed
from ort_zero.examples.train_hf import collate
from ort_zero.integrations.hf_trainer import ORTZeroTrainer as Trainer
from ort_zero.ort.inspection import ort_run_record

CONFIG = "zero3_hf_auto.json"  # shipped with ort_zero (`configs`)
SEQ_LEN = 32


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ort_zero.examples.readme_trainer", description=__doc__)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--deepspeed", type=configs.resolve, default=CONFIG)  # a string default goes through `type`
    args = parser.parse_args(argv)

    rank, _ = init_distributed()  # on CPU: DeepSpeed's process group (accelerate starts only torch's there)
    training_args = TrainingArguments(
        output_dir=str(args.output_dir), deepspeed=str(args.deepspeed), use_cpu=True, max_steps=args.max_steps,
        per_device_train_batch_size=2, learning_rate=2e-3, adam_epsilon=1e-6, logging_steps=1, save_strategy="no",
        report_to=[], disable_tqdm=True,
    )  # fmt: skip
    config = AutoConfig.for_model(
        "llama", vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=2 * SEQ_LEN,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)  # built under deepspeed.zero.Init
    windows = CorpusWindows(1234, 2 * 2 * args.max_steps, SEQ_LEN, load_corpus())
    trainer = Trainer(model=model, args=training_args, train_dataset=windows, data_collator=collate)
    trainer.train()
    if rank == 0:
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        ran_in_ort = ort_run_record(trainer.model_wrapped)["training"]["session"]
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "result.json").write_text(json.dumps({"losses": losses, "ort_session": ran_in_ort}))


if __name__ == "__main__":
    main()

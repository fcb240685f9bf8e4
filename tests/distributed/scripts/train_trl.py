"""TRL's trainers under DeepSpeed ZeRO-3, natively and in ONNX Runtime (ort_zero.integrations.trl), 2 ranks: a small
LLaMA from config, a word-level tokenizer trained in-process on generated sentences (no downloads). Rank 0 writes
<out>/losses.csv (every optimizer step's loss, over its micro-batches and ranks) and, in ORT, <out>/ort.json.

    torchrun --nproc_per_node 2 train_trl.py --trainer sft|dpo --out DIR [--ort] [--lora] [--steps N] [--record DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "ds_configs" / "zero3_hf_auto.json"
SUBJECTS = ["the cat", "a dog", "my friend", "the teacher", "a bird", "the child"]
VERBS = ["sees", "likes", "follows", "finds", "calls", "helps"]
OBJECTS = ["the ball", "a tree", "the house", "a river", "the moon", "a book"]
SPECIAL = ["<pad>", "<unk>", "<bos>", "<eos>"]


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"


def tokenizer() -> Any:
    """A word-level tokenizer trained here on the sentences' words, wrapped as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel(unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [" ".join(SUBJECTS + VERBS + OBJECTS)]
    words.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=SPECIAL))
    return PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )


def datasets(kind: str, seed: int, rows: int) -> Any:
    from datasets import Dataset

    rng = random.Random(seed)
    if kind == "sft":
        return Dataset.from_dict({"text": [sentence(rng) for _ in range(rows)]})
    prompts = [sentence(rng) for _ in range(rows)]
    chosen = [f"and {rng.choice(OBJECTS)}" for _ in range(rows)]
    rejected = [f"{rng.choice(VERBS)} {rng.choice(SUBJECTS)}" for _ in range(rows)]
    return Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})


def model(vocab: int, pad: int) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, pad_token_id=pad, tie_word_embeddings=False,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config)


def lora(model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", choices=["sft", "dpo"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ort", action="store_true")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--bf16", action="store_true", help="TrainingArguments(bf16=True): the config's 'auto' follows")
    parser.add_argument("--record", type=Path, help="record the run there (integrations.run_record)")
    args = parser.parse_args()

    import torch
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    from ort_zero.distributed import init_distributed, shut_down_distributed
    from ort_zero.examples.rank_run import collective_timeout, configure_threads
    from ort_zero.examples.train_hf import StepLosses, recording

    configure_threads()
    rank, _ = init_distributed(collective_timeout())
    common = dict(
        output_dir=str(args.out), deepspeed=str(CONFIG), max_steps=args.steps, per_device_train_batch_size=2,
        learning_rate=5e-3, adam_epsilon=1e-6, logging_steps=1, save_strategy="no", seed=1234, report_to=[],
        disable_tqdm=True, dataloader_num_workers=0, use_cpu=True, max_length=16, bf16=args.bf16,
    )  # fmt: skip
    if args.trainer == "sft":
        config, base = SFTConfig(**common, dataset_text_field="text"), SFTTrainer
    else:
        config, base = DPOConfig(**common, beta=0.1), DPOTrainer
    if args.ort:
        from ort_zero.integrations import trl as ort_trl

        base = ort_trl.ORTSFTTrainer if args.trainer == "sft" else ort_trl.ORTDPOTrainer
    words = tokenizer()
    torch.manual_seed(1234)
    policy = model(len(words), words.pad_token_id)  # after the config: built under zero.Init
    extra: dict[str, Any] = {}
    if args.trainer == "dpo":  # a reference model of its own (in ORT, LoRA too: docs/huggingface.md, TRL)
        torch.manual_seed(1234)
        extra["ref_model"] = model(len(words), words.pad_token_id)  # the policy as it starts
    if args.lora:
        policy = lora(policy)
    step_losses = StepLosses(args.out / "losses.csv", rank)
    trainer = recording(base)(
        model=policy, args=config, train_dataset=datasets(args.trainer, 7, 64 * args.steps),
        processing_class=words, callbacks=[step_losses], **extra,
    )  # fmt: skip
    trainer.step_losses = step_losses
    if args.record is not None:
        from ort_zero.integrations.run_record import record_trainer

        record_trainer(trainer, args.record)
    trainer.train()
    if rank == 0 and args.ort:
        from ort_zero.ort.inspection import ort_run_record

        (args.out / "ort.json").write_text(json.dumps(ort_run_record(trainer.model_wrapped), indent=1) + "\n")
    shut_down_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Adapters that put ort_zero under other libraries' training loops (`hf_trainer`: Hugging Face's Trainer)."""

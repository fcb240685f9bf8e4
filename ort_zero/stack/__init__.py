"""The stack ort_zero runs on: ORT 1.19.2's torch extensions built for today's torch, ORT's CUDA 11 libraries found on
GPU hosts, and the refusal when ORT's CUDA provider cannot load. Nothing here knows about ZeRO-3."""

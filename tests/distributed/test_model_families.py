"""The causal LM families of 2025-2026 train in ONNX Runtime under ZeRO-3 as in PyTorch: ORTZeroTrainer's per-step
losses equal transformers.Trainer's (native DeepSpeed ZeRO-3) within 1e-5, with the attention implementation
`from_pretrained` gives (sdpa where the type has it) and with eager (the extended set: `launch/test.sh --extended`),
2 CPU ranks under torchrun. The families run in few launches (scripts/train_families.py, the example's own job per
family), so the suite pays the start-up once per launch; the six without an export fix or kernel of their own run
in the extended set.

Mixture-of-experts families (gpt_oss, deepseek_v3, qwen3_moe, mixtral, jamba) run transformers' default
experts implementation (grouped_mm) in torch inside a PythonOp (ort_zero/ort/step/torch_kernels/experts.py): every rank
gathers every expert's weights whatever its tokens' routing, so ranks routing differently cannot hang in ZeRO-3's
gathers. sdpa attention runs as torch's fused kernel in a PythonOp (torch_kernels/attention.py); eager attention is
exported as ONNX ops. OLMo is here for
ort_zero's LayerNorm export override (its LayerNorm has no weight; ORT rejects the graph torch writes for it); Jamba
and Zamba for the parameters their Mamba layers read without calling the module that owns them (`conv1d.weight`:
registered as external parameters before the export, ort_zero/zero3/external_params.py); Llama 4 needs the rewrite
of its complex rotary embedding (ort_zero/ort/export/rewrites/rotary.py) and the boolean cumsum override; Cohere 2 the
repeat_interleave override (its interleaved rotary embedding: without it every later dim=-1 of the model is wrong);
DeepSeek-V3.2 hands a bool attention mask to its sparse-attention indexer, which the bridges carry around them
(ORT returns a PythonOp's bool outputs as uint8), and scatters a bool into its mask (traced as an int). Qwen3.5's
linear attention (gated delta rule) needs the most: its triangular solve runs in PyTorch (export_python_ops), its
identity Casts before `x * x` go (passes/same_type_casts), ORT gets a CumSum gradient (ort/export/gradients.py) and its
causal convolution is exported left-padded (export_rewrites).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from launcher import free_port, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "train_families.py"
FAMILIES = [
    "qwen3", "gemma3_text", "smollm3", "olmo2", "phi3", "gpt_oss", "deepseek_v3", "qwen3_moe", "llama4_text",
    "mixtral", "olmo", "jamba", "zamba", "cohere2", "deepseek_v32", "qwen3_5_text",
]  # fmt: skip
# Families with no export fix or kernel of their own (a sibling in the default launch has it): the extended set's.
EXTENDED_FAMILIES = {"gemma3_text", "smollm3", "olmo2", "phi3", "deepseek_v3", "zamba"}
# What from_pretrained gives where it is not sdpa: GPT-OSS's attention sinks have only an eager path in transformers.
DEFAULT_ATTENTION = {"gpt_oss": "eager"}
STEPS = 4
TOLERANCE = 1e-5
BRIDGES = {"ort_zero.zero3.bridges.PreForwardBridge", "ort_zero.zero3.bridges.PostForwardBridge"}
ATTENTION_KERNEL = "ort_zero.ort.step.torch_kernels.attention.ScaledDotProductAttention"
EXPERTS_KERNEL = "ort_zero.ort.step.torch_kernels.experts.ExpertsInTorch"
# The families whose experts class uses transformers' experts implementations (`use_experts_implementation`; Llama
# 4's experts multiply every token by every expert, with no routing to export).
MOE = {"gpt_oss", "deepseek_v3", "qwen3_moe", "mixtral", "jamba"}
# Hybrids whose two tiny layers are all Mamba or linear attention (their attention layers come later).
NO_ATTENTION_LAYER = {"jamba", "zamba", "qwen3_5_text"}


def launch_group(family: str, attn: str) -> tuple[str, ...]:
    """The families launched together with `family`: the default set's in one launch, the extended set's in another."""
    if attn != "default":
        return tuple(FAMILIES)
    return tuple(f for f in FAMILIES if (f in EXTENDED_FAMILIES) == (family in EXTENDED_FAMILIES))


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple[str, ...], str], dict]:
    """One launch per group of families and attention implementation, the first test that needs it starts it."""
    done: dict[tuple[tuple[str, ...], str], dict] = {}

    def families(group: tuple[str, ...], attn: str) -> dict:
        if (group, attn) not in done:
            out = tmp_path_factory.mktemp(f"families-{attn}")
            argv = ["--out", str(out), "--families", ",".join(group), "--attn", attn, "--steps", str(STEPS)]
            run_launcher(torchrun_cmd(SCRIPT, argv, port=free_port()), timeout=900, cwd=ROOT)
            done[group, attn] = json.loads((out / "families.json").read_text())
        return done[group, attn]

    return families


@pytest.mark.parametrize("attn", ["default", pytest.param("eager", marks=pytest.mark.extended)])
@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=pytest.mark.extended) if f in EXTENDED_FAMILIES else f for f in FAMILIES]
)
def test_family_trains_in_ort_as_in_pytorch(
    launches: Callable[[tuple[str, ...], str], dict], family: str, attn: str
) -> None:
    runs = launches(launch_group(family, attn), attn)
    native, ort = runs[f"{family}/{attn}/native"], runs[f"{family}/{attn}/ort"]
    expected = DEFAULT_ATTENTION.get(family, "sdpa") if attn == "default" else attn
    assert native["attn_implementation"] == ort["attn_implementation"] == expected
    assert not native["hooks"] and ort["hooks"], "the native run was on ort_zero's hooks, or the ORT run was not"
    assert ort["ort"]["session"], "no ORT training session"
    assert BRIDGES <= set(ort["ort"]["python_ops"]), ort["ort"]
    has_sdpa = expected == "sdpa" and family not in NO_ATTENTION_LAYER
    assert (ATTENTION_KERNEL in ort["ort"]["python_ops"]) == has_sdpa, ort["ort"]["python_ops"]
    assert (EXPERTS_KERNEL in ort["ort"]["python_ops"]) == (family in MOE), ort["ort"]["python_ops"]
    assert ort["partitioned"]["partitioned"] == ort["partitioned"]["params"], "not built under zero.Init"
    assert len(native["losses"]) == len(ort["losses"]) == STEPS
    diffs = [abs(a - b) for a, b in zip(native["losses"], ort["losses"], strict=True)]
    assert max(diffs) <= TOLERANCE, (
        f"{family} ({attn}): max |loss diff| {max(diffs):.3g}: {native['losses']} vs {ort['losses']}"
    )
    assert native["losses"][-1] < native["losses"][0], f"PyTorch did not learn, the test proves nothing: {native}"

"""ort_zero's TRL classes (training itself: tests/distributed/test_train_trl.py): DPO of a PEFT model without a
reference model is refused before anything starts; TRL's LM-head gather in ORT gathers ZeRO-3 parameters only."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")
peft = pytest.importorskip("peft")

from ort_zero.integrations.hf_trainer import UnsupportedInORT  # noqa: E402
from ort_zero.integrations.trl import ORTDPOTrainer  # noqa: E402
from ort_zero.zero3.foreign_gathers import gathering_parameters_only  # noqa: E402


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def test_dpo_of_a_peft_model_without_a_reference_model_is_refused_in_one_line() -> None:
    model = peft.get_peft_model(Tiny(), peft.LoraConfig(r=2, target_modules=["proj"]))
    with pytest.raises(UnsupportedInORT, match="pass ref_model=") as caught:
        ORTDPOTrainer(model)  # positionally, as TRL's signature orders it
    assert "\n" not in str(caught.value)


def test_the_lm_head_gather_leaves_out_tensors_without_zero3_state() -> None:
    gathered = []
    gather = gathering_parameters_only(lambda *params: gathered.extend(params))
    partitioned = torch.nn.Parameter(torch.zeros(2))
    partitioned.ds_id = 0  # what DeepSpeed's zero.Init gives a parameter
    gather(torch.zeros(2), partitioned, None)  # in ORT: the bridges' gathered tensor, the bias
    assert gathered == [partitioned]

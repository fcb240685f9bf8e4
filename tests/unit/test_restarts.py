"""A process group formed under torchrun's agent store leaves no address there for a restarted attempt to read
(ort_zero/restarts.py); the agent's own keys stay, and outside torchrun's agent nothing is touched."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from ort_zero.restarts import forget_group_addresses
from ort_zero.tools.process_tree import free_port

AGENT_KEY = "none/torchelastic/role_info/0"


@pytest.fixture
def agent_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[dist.TCPStore]:
    """A store as torchrun's agent serves it, and a one-rank gloo group started on it through `env://`."""
    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10))
    agent.set(AGENT_KEY, "the agent's")
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=10))
    try:
        yield agent
    finally:
        dist.destroy_process_group()


def group_keys(agent: dist.TCPStore) -> list[str]:
    return [key for key in agent.list_keys() if key != AGENT_KEY]


def test_a_formed_group_leaves_no_address_in_the_agents_store(agent_store: dist.TCPStore) -> None:
    subgroup = dist.new_group([0])
    dist.barrier(group=subgroup)
    assert len(group_keys(agent_store)) == 2, agent_store.list_keys()  # gloo's address per group
    forget_group_addresses()
    assert group_keys(agent_store) == []
    assert agent_store.get(AGENT_KEY) == b"the agent's"


def test_outside_torchruns_agent_store_nothing_is_deleted(
    agent_store: dist.TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    forget_group_addresses()
    assert len(group_keys(agent_store)) == 1

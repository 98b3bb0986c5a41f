from __future__ import annotations

import hashlib
import os
import stat
import time
from collections import OrderedDict
from pathlib import Path

import pytest

import rdzv
import rdzv.checkpoint
from conftest import Agent

torch = pytest.importorskip("torch")


@pytest.fixture
def memdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "mem"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("RDZV_MEMCKPT_DIR", str(d))
    monkeypatch.setenv("RANK", "2")
    return d


class Box:
    def __init__(self) -> None:
        self.v = 3


class DTensor:
    """Stands for torch's: the type's name is what load() checks."""


def test_off_without_directory(agent: Agent) -> None:
    rdzv.checkpoint.save({"w": torch.ones(2)}, 1)
    rdzv.checkpoint.wait()
    assert agent.requests == []
    assert rdzv.checkpoint.load() is None


def test_save_writes_and_reports(agent: Agent, memdir: Path) -> None:
    w = torch.arange(4, dtype=torch.float32)
    state = {"model": OrderedDict(w=w), "step": 7, "name": "x"}
    rdzv.checkpoint.save(state, 7)
    # The copy is taken before save returns: training may change w at once.
    w.add_(100)
    rdzv.checkpoint.wait()
    f = memdir / "step-7-rank-2.pt"
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    assert [p.name for p in memdir.iterdir()] == [f.name]  # no temporary left
    data = f.read_bytes()
    assert agent.bodies() == [{"step": 7, "rank": 2, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                               "job": "train", "generation": 3}]
    assert agent.requests[0].path == "/v1/memory"
    loaded = torch.load(f, weights_only=True)
    assert torch.equal(loaded["model"]["w"], torch.arange(4, dtype=torch.float32))
    assert isinstance(loaded["model"], OrderedDict)


def test_one_save_in_flight(agent: Agent, memdir: Path) -> None:
    for step in range(1, 6):
        rdzv.checkpoint.save({"w": torch.full((3,), float(step))}, step)
    rdzv.checkpoint.wait()
    assert [b["step"] for b in agent.bodies("/v1/memory")] == [1, 2, 3, 4, 5]


def test_load(memdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rdzv.checkpoint.save({"w": torch.ones(2), "step": 9}, 9)
    rdzv.checkpoint.wait()
    assert rdzv.checkpoint.load() is None  # not resumed from memory
    monkeypatch.setenv("RDZV_RESUME_MEMORY", "9")
    got = rdzv.checkpoint.load()
    assert got is not None and got["step"] == 9 and torch.equal(got["w"], torch.ones(2))
    monkeypatch.setenv("RDZV_RESUME_MEMORY", "10")
    with pytest.raises(FileNotFoundError):
        rdzv.checkpoint.load()


def test_load_other_objects(memdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rdzv.checkpoint.save({"box": Box()}, 1)
    rdzv.checkpoint.wait()
    monkeypatch.setenv("RDZV_RESUME_MEMORY", "1")
    got = rdzv.checkpoint.load()
    assert got is not None and got["box"].v == 3


def test_write_failure_does_not_raise(agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RDZV_MEMCKPT_DIR", str(tmp_path / "missing"))
    rdzv.checkpoint.save({"w": torch.ones(1)}, 1)
    rdzv.checkpoint.wait()
    assert agent.requests == []
    assert "writing the in-memory checkpoint failed" in capsys.readouterr().err


def test_bad_step() -> None:
    with pytest.raises(ValueError):
        rdzv.checkpoint.save({}, -1)


@pytest.fixture
def persisting(memdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Persist every 2nd step of a 2-rank job to checkpoint.dir."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    monkeypatch.setenv("RDZV_CHECKPOINT_DIR", str(ckpt))
    monkeypatch.setenv("RDZV_MEMCKPT_PERSIST_EVERY", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    return ckpt


def save_as(monkeypatch: pytest.MonkeyPatch, rank: int, step: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    rdzv.checkpoint.save({"w": torch.full((3,), float(rank)), "step": step}, step)
    rdzv.checkpoint.wait()


def test_persist_every(agent: Agent, memdir: Path, persisting: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for step in range(1, 5):
        save_as(monkeypatch, 0, step)
    assert sorted(p.name for p in persisting.iterdir()) == ["memory-step-2", "memory-step-4"]
    step2 = persisting / "memory-step-2"
    assert [p.name for p in step2.iterdir()] == ["g3-rank-0.pt"], "complete with one rank of two"
    assert (step2 / "g3-rank-0.pt").read_bytes() == (memdir / "step-2-rank-0.pt").read_bytes()
    assert stat.S_IMODE(os.stat(step2 / "g3-rank-0.pt").st_mode) == 0o600

    # The last rank to write its file marks the step complete, once.
    save_as(monkeypatch, 1, 2)
    assert sorted(p.name for p in step2.iterdir()) == ["COMPLETE", "g3-rank-0.pt", "g3-rank-1.pt"]
    assert (step2 / "COMPLETE").read_text() == '{"step": 2, "generation": 3, "world_size": 2}'
    save_as(monkeypatch, 1, 4)
    assert (persisting / "memory-step-4" / "COMPLETE").exists()
    # Steps not due are not persisted.
    save_as(monkeypatch, 1, 5)
    assert not (persisting / "memory-step-5").exists()

    # A generation's files never complete another's step: generation 4's
    # rank 1 finds generation 3's rank 0 only.
    save_as(monkeypatch, 0, 8)
    monkeypatch.setenv("RDZV_GENERATION", "4")
    save_as(monkeypatch, 1, 8)
    assert sorted(p.name for p in (persisting / "memory-step-8").iterdir()) == ["g3-rank-0.pt", "g4-rank-1.pt"]
    monkeypatch.setenv("RDZV_GENERATION", "3")

    # Two complete steps are kept; an older complete one only goes once
    # its COMPLETE is PERSISTED_GRACE old: the step the controller would
    # resume from may trail the newest.
    save_as(monkeypatch, 0, 6)
    save_as(monkeypatch, 1, 6)
    assert (persisting / "memory-step-2").exists(), "removed within the grace"
    old = time.time() - rdzv.checkpoint.PERSISTED_GRACE - 1
    os.utime(persisting / "memory-step-2" / "COMPLETE", (old, old))
    os.utime(persisting / "memory-step-4" / "COMPLETE", (old, old))
    monkeypatch.setenv("RDZV_RESUME_FROM", str(persisting / "memory-step-4"))  # never the one resumed from
    save_as(monkeypatch, 0, 10)
    save_as(monkeypatch, 1, 10)
    # Step 8 is incomplete but newer than the kept ones: it may complete yet.
    assert sorted(p.name for p in persisting.iterdir()) == ["memory-step-10", "memory-step-4", "memory-step-6", "memory-step-8"]


def test_persist_alone_keeps_two_files(agent: Agent, memdir: Path, persisting: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 1 never writes here (a directory this node sees alone): rank 0
    # keeps its two newest files, not one per step.
    for step in range(1, 11):
        save_as(monkeypatch, 0, step)
    assert sorted(p.name for p in persisting.iterdir()) == ["memory-step-10", "memory-step-8"]
    assert [p.name for p in (persisting / "memory-step-8").iterdir()] == ["g3-rank-0.pt"]


def test_persist_needs_a_checkpoint_dir(agent: Agent, memdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDZV_MEMCKPT_PERSIST_EVERY", "1")
    save_as(monkeypatch, 0, 1)
    assert [p.name for p in memdir.iterdir()] == ["step-1-rank-0.pt"]


def test_load_persisted(agent: Agent, memdir: Path, persisting: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_as(monkeypatch, 0, 2)
    save_as(monkeypatch, 1, 2)
    monkeypatch.setenv("RDZV_RESUME_FROM", str(persisting / "memory-step-2"))
    monkeypatch.setenv("RANK", "1")
    got = rdzv.checkpoint.load()
    assert got["step"] == 2 and torch.equal(got["w"], torch.full((3,), 1.0))
    # A larger world: rank 3 takes rank 1's (3 mod 2) replicated state.
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert torch.equal(rdzv.checkpoint.load()["w"], torch.full((3,), 1.0))
    # Resuming from memory wins; another durable checkpoint is the job's.
    monkeypatch.setenv("RDZV_RESUME_FROM", str(persisting))
    assert rdzv.checkpoint.load() is None


def test_load_saved_by_another_world(memdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    save_as(monkeypatch, 0, 5)
    save_as(monkeypatch, 1, 5)
    monkeypatch.setenv("RDZV_RESUME_MEMORY", "5")
    monkeypatch.setenv("RDZV_RESUME_MEMORY_WORLD", "2")
    # The same world: each rank its own.
    monkeypatch.setenv("RANK", "1")
    assert torch.equal(rdzv.checkpoint.load()["w"], torch.full((3,), 1.0))
    # A larger world: rank 2 takes rank 0's (2 mod 2) replicated state.
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    assert torch.equal(rdzv.checkpoint.load()["w"], torch.full((3,), 0.0))
    # A smaller one: rank 0 its own.
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert torch.equal(rdzv.checkpoint.load()["w"], torch.full((3,), 0.0))
    # Unset (an older agent): the same world, each rank its own.
    monkeypatch.delenv("RDZV_RESUME_MEMORY_WORLD")
    monkeypatch.setenv("RANK", "1")
    assert torch.equal(rdzv.checkpoint.load()["w"], torch.full((3,), 1.0))


def test_sharded_state_saved_by_another_world_is_refused(memdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    rdzv.checkpoint.save({"model": {"w": DTensor()}}, 7)
    rdzv.checkpoint.wait()
    monkeypatch.setenv("RDZV_RESUME_MEMORY", "7")
    monkeypatch.setenv("RDZV_RESUME_MEMORY_WORLD", "2")
    assert isinstance(rdzv.checkpoint.load()["model"]["w"], DTensor)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(RuntimeError, match="sharded tensors.*checkpoint.memory.replicated"):
        rdzv.checkpoint.load()


def test_sharded_state_refuses_another_world() -> None:
    class DTensor:  # the name is what is checked: torch.distributed need not load
        pass

    assert rdzv.checkpoint._has_dtensor({"model": OrderedDict(w=[1, (2, DTensor())])})
    assert not rdzv.checkpoint._has_dtensor({"model": OrderedDict(w=torch.ones(1))})

from __future__ import annotations

import hashlib
import os
import stat
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

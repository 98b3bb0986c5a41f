from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

import rdzv
from conftest import TOKEN, Agent, FakeClock


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert rdzv.resume_from() is None
    assert rdzv.checkpoint_dir() is None
    assert rdzv.generation() == 0
    assert not rdzv.under_rdzv()
    monkeypatch.setenv("RDZV_RESUME_FROM", "/ckpt/step-40")
    monkeypatch.setenv("RDZV_CHECKPOINT_DIR", "/ckpt")
    monkeypatch.setenv("RDZV_GENERATION", "7")
    monkeypatch.setenv("RDZV_AGENT_ADDR", "127.0.0.1:1")
    assert rdzv.resume_from() == "/ckpt/step-40"
    assert rdzv.checkpoint_dir() == "/ckpt"
    assert rdzv.generation() == 7
    assert rdzv.under_rdzv()
    monkeypatch.setenv("RDZV_RESUME_FROM", "")  # the agent's fresh start
    assert rdzv.resume_from() is None


def test_report_step(agent: Agent, clock: FakeClock) -> None:
    rdzv.report_step(5, loss=1.5)
    assert len(agent.requests) == 1
    r = agent.requests[0]
    assert r.path == "/v1/step"
    assert r.headers["authorization"] == "Bearer " + TOKEN
    assert r.headers["content-type"] == "application/json"
    # Metrics are checked but not sent: the agent does not take them yet.
    assert r.body == {"step": 5, "job": "train", "generation": 3}


def test_rate_limit(agent: Agent, clock: FakeClock) -> None:
    rdzv.report_step(1)
    rdzv.report_step(2)  # within 0.5 s of the first: not sent
    rdzv.report_step(3, force=True)
    clock.now += 0.5
    rdzv.report_step(4)
    assert agent.steps() == [1, 3, 4]


def test_failed_step_backs_off(agent: Agent, clock: FakeClock, capsys: pytest.CaptureFixture[str]) -> None:
    agent.status, agent.reason = 409, "job train generation 3 is not running on this node"
    rdzv.report_step(1)
    clock.now += 5
    rdzv.report_step(2)  # within the 10 s back-off
    clock.now += 6
    rdzv.report_step(3)
    rdzv.report_step(4, force=True)
    assert agent.steps() == [1, 3, 4]
    assert capsys.readouterr().err == (
        "rdzv: step report to the rdzv agent failed (not repeated): "
        "agent answered 409: job train generation 3 is not running on this node\n")


def test_checkpoint_complete(agent: Agent, tmp_path: Path) -> None:
    ckpt = tmp_path / "step-8"
    ckpt.mkdir()
    rdzv.checkpoint_complete(str(ckpt), 8)
    assert (ckpt / "COMPLETE").read_text() == "8\n"
    assert sorted(os.listdir(ckpt)) == ["COMPLETE"]  # no temporary left
    assert agent.checkpoints() == [{"step": 8, "path": str(ckpt), "job": "train", "generation": 3}]
    assert agent.requests[0].headers["authorization"] == "Bearer " + TOKEN


def test_checkpoint_keeps_existing_marker(agent: Agent, tmp_path: Path) -> None:
    (tmp_path / "step-8").mkdir()
    (tmp_path / "step-8" / "COMPLETE").write_text("mine")
    os.chdir(tmp_path)
    rdzv.checkpoint_complete(Path("step-8"), 8)  # relative paths are made absolute
    assert (tmp_path / "step-8" / "COMPLETE").read_text() == "mine"
    assert agent.checkpoints()[0]["path"] == str(tmp_path / "step-8")


def test_no_agent_sends_nothing_but_marks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rdzv.report_step(1, force=True)
    rdzv.checkpoint_complete(str(tmp_path), 1)
    assert (tmp_path / "COMPLETE").exists()
    assert capsys.readouterr() == ("", "")


def test_agent_unreachable_never_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    monkeypatch.setenv("RDZV_AGENT_ADDR", "127.0.0.1:%d" % port)
    rdzv.report_step(1, force=True)
    rdzv.report_step(2, force=True)
    rdzv.checkpoint_complete(str(tmp_path), 2)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err  # once per kind
    assert err[0].startswith("rdzv: step report to the rdzv agent failed (not repeated): ")
    assert err[1].startswith("rdzv: checkpoint report to the rdzv agent failed (not repeated): ")


@pytest.mark.parametrize("addr", ["nonsense", "127.0.0.1:notaport", ":"])
def test_bad_agent_addr_never_raises(monkeypatch: pytest.MonkeyPatch, addr: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RDZV_AGENT_ADDR", addr)
    rdzv.report_step(1, force=True)
    assert "step report to the rdzv agent failed" in capsys.readouterr().err


def test_marker_failure_still_reports(agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(directory: str, step: int) -> None:
        raise PermissionError("read-only")

    monkeypatch.setattr(rdzv._core, "_write_marker", refuse)
    rdzv.checkpoint_complete(str(tmp_path), 4)
    assert len(agent.checkpoints()) == 1
    assert capsys.readouterr().err == "rdzv: writing the checkpoint's COMPLETE marker failed (not repeated): read-only\n"


@pytest.mark.parametrize("step", [-1, "7", 1.5, True, None])
def test_bad_step(agent: Agent, tmp_path: Path, step: object) -> None:
    with pytest.raises(ValueError, match=r"step must be an integer >= 0, got "):
        rdzv.report_step(step)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"step must be an integer >= 0, got "):
        rdzv.checkpoint_complete(str(tmp_path), step)  # type: ignore[arg-type]
    assert agent.requests == []


def test_bad_metric(agent: Agent) -> None:
    with pytest.raises(ValueError, match=r"metric loss must be a real number, got 'low'"):
        rdzv.report_step(1, loss="low")  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ["", None, b"/x"])
def test_bad_path(agent: Agent, path: object) -> None:
    with pytest.raises(ValueError, match=r"path must be a checkpoint directory, got "):
        rdzv.checkpoint_complete(path, 1)  # type: ignore[arg-type]


def test_missing_path(agent: Agent, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"path must be an existing checkpoint directory, got '.*/nope'"):
        rdzv.checkpoint_complete(str(tmp_path / "nope"), 1)
    assert agent.requests == []

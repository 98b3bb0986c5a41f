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
    assert r.body == {"step": 5, "job": "train", "generation": 3, "metrics": {"loss": 1.5}}


def test_report_step_without_metrics(agent: Agent, clock: FakeClock) -> None:
    rdzv.report_step(5)
    assert agent.bodies() == [{"step": 5, "job": "train", "generation": 3}]


def test_metrics(agent: Agent, clock: FakeClock) -> None:
    rdzv.report_step(1, force=True, loss=2, **{"train/lr": 3e-4}, grad_norm=float("nan"),
                     up=float("inf"), down=float("-inf"))
    assert agent.bodies()[0]["metrics"] == {"loss": 2.0, "train/lr": 3e-4, "grad_norm": "NaN",
                                            "up": "Infinity", "down": "-Infinity"}
    many = {"m%d" % i: i for i in range(rdzv.MAX_METRICS)}
    rdzv.report_step(2, force=True, **many)
    assert len(agent.bodies()[1]["metrics"]) == rdzv.MAX_METRICS


def test_final_step(agent: Agent, clock: FakeClock) -> None:
    rdzv.report_step(1)
    rdzv.report_step(2, final=True, loss=0.5)  # within the rate limit: sent anyway
    assert agent.bodies("/v1/step")[1] == {"step": 2, "phase": "done", "metrics": {"loss": 0.5},
                                           "job": "train", "generation": 3}


def test_report_done(agent: Agent, clock: FakeClock) -> None:
    rdzv.report_step(7)
    rdzv.report_step(9)  # rate limited, still the last step seen
    rdzv.report_done()
    rdzv.report_done(12)
    assert [(b["step"], b.get("phase")) for b in agent.bodies()] == [(7, None), (9, "done"), (12, "done")]


def test_report_done_before_any_step(agent: Agent) -> None:
    rdzv.report_done()
    assert agent.bodies() == [{"step": 0, "phase": "done", "job": "train", "generation": 3}]


def test_checkpoint_phases(agent: Agent, clock: FakeClock, tmp_path: Path) -> None:
    rdzv.report_step(39)
    rdzv.checkpoint_begin(40)  # always sent, whatever the rate limit
    with rdzv.saving(41):
        pass
    rdzv.checkpoint_complete(str(tmp_path), 41)
    assert [(r.path, r.body["step"], r.body.get("phase")) for r in agent.requests] == [
        ("/v1/step", 39, None), ("/v1/step", 40, "saving"), ("/v1/step", 41, "saving"), ("/v1/checkpoint", 41, None)]


def test_saving_reraises(agent: Agent) -> None:
    with pytest.raises(OSError, match="disk full"):
        with rdzv.saving(5):
            raise OSError("disk full")
    assert agent.bodies() == [{"step": 5, "phase": "saving", "job": "train", "generation": 3}]


def test_phases_outside_rdzv_send_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    rdzv.checkpoint_begin(1)
    with rdzv.saving(2):
        pass
    rdzv.report_step(3, final=True)
    rdzv.report_done()
    assert capsys.readouterr().err == ""


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
    with pytest.raises(ValueError, match=r"metric ok must be a real number, got True"):
        rdzv.report_step(1, ok=True)
    with pytest.raises(ValueError, match=r"at most 16 metrics are allowed, got 17"):
        rdzv.report_step(1, **{"m%d" % i: i for i in range(17)})
    with pytest.raises(ValueError, match=r"metric name 'l{65}' must be at most 64 characters"):
        rdzv.report_step(1, **{"l" * 65: 1})
    with pytest.raises(ValueError, match=r"metric name 'a b' must be"):
        rdzv.report_step(1, **{"a b": 1})
    assert agent.requests == []


@pytest.mark.parametrize("step", [-1, "7", 1.5, True])
def test_bad_phase_step(agent: Agent, step: object) -> None:
    with pytest.raises(ValueError, match=r"step must be an integer >= 0, got "):
        rdzv.checkpoint_begin(step)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"step must be an integer >= 0, got "):
        rdzv.report_done(step)  # type: ignore[arg-type]
    assert agent.requests == []


@pytest.mark.parametrize("path", ["", None, b"/x"])
def test_bad_path(agent: Agent, path: object) -> None:
    with pytest.raises(ValueError, match=r"path must be a checkpoint directory, got "):
        rdzv.checkpoint_complete(path, 1)  # type: ignore[arg-type]


def test_missing_path(agent: Agent, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"path must be an existing checkpoint directory, got '.*/nope'"):
        rdzv.checkpoint_complete(str(tmp_path / "nope"), 1)
    assert agent.requests == []

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import Agent
from distributed import run_worker

pytestmark = pytest.mark.frameworks
pytest.importorskip("torch.distributed.checkpoint")


def test_save_marks_complete_and_load_resumes(agent: Agent, tmp_path: Path) -> None:
    # Left by a worker killed mid-save: replaced, never reported.
    (tmp_path / ".step-3.tmp").mkdir()
    (tmp_path / ".step-3.tmp" / "junk").write_text("x")
    out = run_worker("dcp_worker.py", [str(tmp_path), "3"], {"RDZV_CHECKPOINT_DIR": str(tmp_path)})
    assert "SAVED %s\n" % (tmp_path / "step-3") in out
    assert sorted(os.listdir(tmp_path)) == ["step-3"]
    files = sorted(os.listdir(tmp_path / "step-3"))
    assert ".metadata" in files and "COMPLETE" in files and "junk" not in files
    assert agent.checkpoints() == [{"step": 3, "path": str(tmp_path / "step-3"), "job": "train", "generation": 3}]
    # The save began before it completed: a long one is not a hang.
    assert [r.path for r in agent.requests] == ["/v1/step", "/v1/checkpoint"]
    assert agent.bodies("/v1/step") == [{"step": 3, "phase": "saving", "job": "train", "generation": 3}]

    out = run_worker("dcp_worker.py", [str(tmp_path), "5"],
                     {"RDZV_CHECKPOINT_DIR": str(tmp_path), "RDZV_RESUME_FROM": str(tmp_path / "step-3")})
    assert "LOADED 3 1.0\n" in out  # four weights of 0.25
    assert [c["step"] for c in agent.checkpoints()] == [3, 5]


def test_bad_arguments() -> None:
    from rdzv.integrations import dcp as rdzv_dcp

    with pytest.raises(ValueError, match=r"step must be an integer >= 0, got -1"):
        rdzv_dcp.save({}, "/ckpt", -1)
    with pytest.raises(ValueError, match=r"checkpoint_id is chosen by rdzv.integrations.dcp.save"):
        rdzv_dcp.save({}, "/ckpt", 1, checkpoint_id="/elsewhere")

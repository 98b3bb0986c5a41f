from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Agent
from distributed import run_worker

pytestmark = pytest.mark.frameworks
pytest.importorskip("deepspeed")


def test_save_marks_complete_and_load_resumes(agent: Agent, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    out = run_worker("deepspeed_worker.py", [str(ckpt), "4"], {"RDZV_CHECKPOINT_DIR": str(ckpt)})
    assert "RESUMED" not in out
    assert [(c["step"], c["path"]) for c in agent.checkpoints()] == [
        (2, str(ckpt / "global_step2")), (4, str(ckpt / "global_step4"))]
    assert (ckpt / "latest").read_text() == "global_step4"
    assert [(b["step"], b.get("phase")) for b in agent.bodies("/v1/step") if b.get("phase")] == [(2, "saving"), (4, "saving")]
    for step in (2, 4):
        d = ckpt / ("global_step%d" % step)
        assert (d / "COMPLETE").read_text() == "%d\n" % step
        assert list(d.glob("*optim_states.pt")), sorted(p.name for p in d.iterdir())  # ZeRO's shards

    out = run_worker("deepspeed_worker.py", [str(ckpt), "6"],
                     {"RDZV_CHECKPOINT_DIR": str(ckpt), "RDZV_RESUME_FROM": str(ckpt / "global_step4")})
    assert "RESUMED %s 4\n" % (ckpt / "global_step4" / "mp_rank_00_model_states.pt") in out  # load_path: the model states
    assert [c["step"] for c in agent.checkpoints()] == [2, 4, 6]


def test_bad_step() -> None:
    from rdzv.integrations import deepspeed as rdzv_ds

    with pytest.raises(ValueError, match=r"step must be an integer >= 0, got -2"):
        rdzv_ds.save_checkpoint(object(), "/ckpt", -2)

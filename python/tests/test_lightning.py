from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import Agent

pytestmark = pytest.mark.frameworks
torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from rdzv.integrations.lightning import RdzvCallback, RdzvCheckpointIO, resume_checkpoint  # noqa: E402


class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> Any:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def trainer(tmp_path: Path, max_steps: int, **ckpt: Any) -> Any:
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path), filename="step-{step}/model",
                                              auto_insert_metric_name=False, every_n_train_steps=2, **ckpt)
    return pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[checkpoint, RdzvCallback()])


def test_trainer_reports_steps_and_checkpoints(agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resume_checkpoint() is None
    t = trainer(tmp_path, 4, save_top_k=-1)
    t.fit(Tiny(), loader(), ckpt_path=resume_checkpoint())
    assert isinstance(t.strategy.checkpoint_io, RdzvCheckpointIO)
    assert [(c["step"], c["path"]) for c in agent.checkpoints()] == [
        (2, str(tmp_path / "step-2")), (4, str(tmp_path / "step-4"))]
    for step in (2, 4):
        assert (tmp_path / ("step-%d" % step) / "COMPLETE").read_text() == "%d\n" % step
        assert (tmp_path / ("step-%d" % step) / "model.ckpt").is_file()
    assert agent.steps()[0] == 1 and agent.steps()[-1] == 4
    phases = [(b["step"], b["phase"]) for b in agent.bodies("/v1/step") if "phase" in b]
    assert (2, "saving") in phases and (4, "saving") in phases
    assert phases[-1] == (4, "done"), "the end of training is the last step, final"

    # The next generation resumes from what rdzv chose, and save_top_k=1
    # removes older checkpoints marker first: no directory left looks complete.
    monkeypatch.setenv("RDZV_RESUME_FROM", str(tmp_path / "step-4"))
    assert resume_checkpoint() == str(tmp_path / "step-4" / "model.ckpt")
    t = trainer(tmp_path, 8, save_top_k=1, monitor="step", mode="max")
    t.fit(Tiny(), loader(), ckpt_path=resume_checkpoint())
    assert t.global_step == 8
    assert [c["step"] for c in agent.checkpoints()] == [2, 4, 6, 8]
    assert not (tmp_path / "step-6").exists()
    assert (tmp_path / "step-8" / "COMPLETE").exists()

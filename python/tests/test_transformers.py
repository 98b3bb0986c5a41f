from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import Agent

pytestmark = pytest.mark.frameworks
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rdzv.integrations.transformers import RdzvCallback, resume_checkpoint  # noqa: E402


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[misc,name-defined]
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> "dict[str, Any]":
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_trainer_reports_steps_and_checkpoints(agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resume_checkpoint() is None
    monkeypatch.setenv("RDZV_CHECKPOINT_DIR", str(tmp_path))
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=64, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, save_steps=2, logging_steps=1, per_device_train_batch_size=2,
        use_cpu=True, report_to=[], dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=RandomTokens(8, 16, 64),
                                   callbacks=[RdzvCallback()])
    trainer.train(resume_from_checkpoint=resume_checkpoint())

    assert agent.checkpoints() == [
        {"step": 2, "path": str(tmp_path / "checkpoint-2"), "job": "train", "generation": 3},
        {"step": 4, "path": str(tmp_path / "checkpoint-4"), "job": "train", "generation": 3},
    ]
    for step in (2, 4):
        assert (tmp_path / ("checkpoint-%d" % step) / "COMPLETE").read_text() == "%d\n" % step
    steps = agent.steps()
    assert steps[0] == 1 and steps[-1] == 4  # the first step, then the last, forced at the end
    # Each save began after its step, and the end is the last step, final.
    assert [(b["step"], b["phase"]) for b in agent.bodies("/v1/step") if "phase" in b] == [
        (2, "saving"), (4, "saving"), (4, "done")]
    assert "loss" in agent.bodies("/v1/step")[-1]["metrics"]

    # The next generation resumes from what rdzv chose.
    monkeypatch.setenv("RDZV_RESUME_FROM", str(tmp_path / "checkpoint-4"))
    assert resume_checkpoint() == str(tmp_path / "checkpoint-4")
    args.max_steps = 6
    trainer = transformers.Trainer(model=model, args=args, train_dataset=RandomTokens(8, 16, 64),
                                   callbacks=[RdzvCallback()])
    trainer.train(resume_from_checkpoint=resume_checkpoint())
    assert trainer.state.global_step == 6
    assert agent.checkpoints()[-1]["path"] == str(tmp_path / "checkpoint-6")

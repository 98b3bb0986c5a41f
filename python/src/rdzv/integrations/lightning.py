"""PyTorch Lightning: a Callback that reports every training step and marks
each checkpoint complete once Lightning has written it.

    from lightning.pytorch.callbacks import ModelCheckpoint
    from rdzv.integrations.lightning import RdzvCallback, resume_checkpoint

    ckpt = ModelCheckpoint(dirpath=rdzv.checkpoint_dir(), filename="step-{step}/model",
                           auto_insert_metric_name=False, every_n_train_steps=500, save_top_k=-1)
    trainer = Trainer(callbacks=[ckpt, RdzvCallback()], ...)
    trainer.fit(model, ckpt_path=resume_checkpoint())

rdzv resumes from directories, so each checkpoint file goes into its own
step-N directory (the filename above). Lightning's on_save_checkpoint hook
runs before the file is written, so the callback instead wraps the
strategy's CheckpointIO: its save_checkpoint calls through, and once that
returned, and the file is a *.ckpt inside a directory whose name ends in a
number, marks that directory complete. Under AsyncCheckpointIO the inner
CheckpointIO is wrapped, so the mark follows the write in the saving thread.
Removing a checkpoint (save_top_k) removes the marker first, so a directory
losing its file never looks complete. Strategies that save without
CheckpointIO (DeepSpeed's) are not covered: use rdzv.integrations.deepspeed.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Optional

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, CheckpointIO
except ImportError:  # the older package name
    from pytorch_lightning import Callback, LightningModule, Trainer
    from pytorch_lightning.plugins.io import AsyncCheckpointIO, CheckpointIO

import rdzv

__all__ = ["RdzvCallback", "RdzvCheckpointIO", "resume_checkpoint"]

_STEP_DIR = re.compile(r"[0-9]+$")


def resume_checkpoint() -> Optional[str]:
    """The file for trainer.fit(ckpt_path=...): the newest *.ckpt in the
    directory rdzv chose, or None on a fresh start (or when it holds none)."""
    path = rdzv.resume_from()
    if path is None:
        return None
    if os.path.isfile(path):
        return path
    files = sorted(glob.glob(os.path.join(glob.escape(path), "*.ckpt")), key=os.path.getmtime)
    return files[-1] if files else None


class RdzvCheckpointIO(CheckpointIO):  # type: ignore[misc]
    """Wraps a CheckpointIO: marks a checkpoint's step directory complete
    after the wrapped save returned. Lightning calls save_checkpoint on the
    global rank zero only."""

    def __init__(self, inner: CheckpointIO) -> None:
        super().__init__()
        self.inner = inner

    def save_checkpoint(self, checkpoint: "dict[str, Any]", path: Any, storage_options: Optional[Any] = None) -> None:
        step = int(checkpoint.get("global_step", 0))
        # A long save is bounded by health.checkpoint_timeout, not
        # progress_timeout, until it is complete or training goes on.
        rdzv.checkpoint_begin(step)
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        directory = _step_dir(path)
        if directory is not None:
            rdzv.checkpoint_complete(directory, step)

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None, **kwargs: Any) -> "dict[str, Any]":
        return self.inner.load_checkpoint(path, map_location=map_location, **kwargs)  # type: ignore[no-any-return]

    def remove_checkpoint(self, path: Any) -> None:
        directory = _step_dir(path)
        if directory is not None:
            try:
                os.remove(os.path.join(directory, rdzv.MARKER))
            except FileNotFoundError:
                pass
        self.inner.remove_checkpoint(path)
        if directory is not None:
            try:
                os.rmdir(directory)  # only when the checkpoint file was all it held
            except OSError:
                pass

    def teardown(self) -> None:
        self.inner.teardown()


def _step_dir(path: Any) -> Optional[str]:
    """The directory of a local *.ckpt file when its name ends in a number."""
    p = os.fspath(path)
    if not isinstance(p, str) or "://" in p or not p.endswith(".ckpt"):
        return None
    directory = os.path.dirname(os.path.abspath(p))
    return directory if _STEP_DIR.search(os.path.basename(directory)) else None


class RdzvCallback(Callback):  # type: ignore[misc]
    """Reports trainer.global_step after every training batch, and the end
    of training (rdzv.report_done) so that the final save and the exit are
    never taken for a hang, and installs RdzvCheckpointIO on the trainer's
    strategy."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        io = strategy.checkpoint_io  # the property fills in Lightning's default
        if isinstance(io, AsyncCheckpointIO):
            if not isinstance(io.checkpoint_io, RdzvCheckpointIO):
                # Its setter takes an inner CheckpointIO only once.
                io._checkpoint_io = RdzvCheckpointIO(io.checkpoint_io)
        elif not isinstance(io, RdzvCheckpointIO):
            strategy.checkpoint_io = RdzvCheckpointIO(io)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        rdzv.report_step(trainer.global_step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        rdzv.report_step(trainer.global_step, final=True)

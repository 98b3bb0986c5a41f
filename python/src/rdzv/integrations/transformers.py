"""Hugging Face Transformers: a TrainerCallback that reports every step and
marks each checkpoint Trainer saved complete.

    from rdzv.integrations.transformers import RdzvCallback, resume_checkpoint

    args = TrainingArguments(output_dir=rdzv.checkpoint_dir(), save_steps=500, ...)
    trainer = Trainer(model=model, args=args, callbacks=[RdzvCallback()], ...)
    trainer.train(resume_from_checkpoint=resume_checkpoint())

Trainer saves output_dir/checkpoint-N; with output_dir set to the job's
checkpoint.dir rdzv can resume from them.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import rdzv

__all__ = ["RdzvCallback", "resume_checkpoint"]

# Trainer's name for a checkpoint directory (transformers.trainer_utils.PREFIX_CHECKPOINT_DIR).
_PREFIX = "checkpoint"


def resume_checkpoint() -> Optional[str]:
    """The checkpoint for trainer.train(resume_from_checkpoint=...): the
    checkpoint-N directory rdzv chose, or None on a fresh start."""
    return rdzv.resume_from()


class RdzvCallback(TrainerCallback):  # type: ignore[misc]
    """Reports each optimizer step, with the latest logged loss, and marks
    output_dir/checkpoint-N complete once Trainer has written it (on_save
    runs after Trainer's save returned). Checkpoints are marked only by the
    world's process zero, which is the one that wrote trainer_state.json.
    A step after which Trainer saves reports the save's beginning
    (rdzv.checkpoint_begin), and the end of training reports the last step
    (final), so that neither a long save nor the work after the last step
    is taken for a hang."""

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        _report(state)
        # Trainer's flow callback, which runs before user callbacks, has
        # decided by now whether this step saves; the save follows this hook.
        if control.should_save:
            rdzv.checkpoint_begin(state.global_step)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        path = os.path.join(args.output_dir, "%s-%d" % (_PREFIX, state.global_step))
        if os.path.isdir(path):
            rdzv.checkpoint_complete(path, state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        _report(state, final=True)


def _report(state: TrainerState, final: bool = False) -> None:
    """Reports the step with the loss Trainer last logged, if any: already a
    float, so reading it costs no device synchronisation."""
    for entry in reversed(state.log_history[-4:]):
        loss = entry.get("loss")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss):
            rdzv.report_step(state.global_step, final=final, loss=float(loss))
            return
    rdzv.report_step(state.global_step, final=final)

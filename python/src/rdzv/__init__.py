"""rdzv: report training progress and complete checkpoints to the rdzv agent
running this worker, and resume from the checkpoint rdzv chose.

    import rdzv

    path = rdzv.resume_from()          # None on a fresh start
    for step in range(start, steps + 1):
        train_one_step()
        rdzv.report_step(step, loss=loss)   # cheap: call it every step
        if step % 100 == 0:
            with rdzv.saving(step):        # a long save is not a hang
                path = save(step)
            if rank == 0:
                rdzv.checkpoint_complete(path, step)   # after the save returned
    rdzv.report_done()                 # the final save and exit are not a hang

In-memory checkpoints replicated to a peer node: rdzv.checkpoint.save and
rdzv.checkpoint.load (docs/checkpoints.md).

Outside rdzv every report does nothing. No report raises; bad arguments
raise ValueError. Integrations for Hugging Face Transformers, PyTorch
Lightning, DeepSpeed and torch.distributed.checkpoint live in
rdzv.integrations.
"""

from rdzv._core import (
    MARKER,
    MAX_METRIC_NAME,
    MAX_METRICS,
    checkpoint_begin,
    checkpoint_complete,
    checkpoint_dir,
    generation,
    report_done,
    report_step,
    resume_from,
    saving,
    under_rdzv,
)
from rdzv import checkpoint

__all__ = [
    "MARKER",
    "MAX_METRICS",
    "MAX_METRIC_NAME",
    "checkpoint",
    "checkpoint_begin",
    "checkpoint_complete",
    "checkpoint_dir",
    "generation",
    "report_done",
    "report_step",
    "resume_from",
    "saving",
    "under_rdzv",
]
__version__ = "0.1.0"

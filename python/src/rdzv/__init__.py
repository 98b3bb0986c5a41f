"""rdzv: report training progress and complete checkpoints to the rdzv agent
running this worker, and resume from the checkpoint rdzv chose.

    import rdzv

    path = rdzv.resume_from()          # None on a fresh start
    for step in range(start, steps + 1):
        train_one_step()
        rdzv.report_step(step)         # cheap: call it every step
        if rank == 0 and step % 100 == 0:
            rdzv.checkpoint_complete(save(step), step)   # after the save returned

Outside rdzv every report does nothing. No report raises; bad arguments
raise ValueError. Integrations for Hugging Face Transformers, PyTorch
Lightning, DeepSpeed and torch.distributed.checkpoint live in
rdzv.integrations.
"""

from rdzv._core import (
    MARKER,
    checkpoint_complete,
    checkpoint_dir,
    generation,
    report_step,
    resume_from,
    under_rdzv,
)

__all__ = [
    "MARKER",
    "checkpoint_complete",
    "checkpoint_dir",
    "generation",
    "report_step",
    "resume_from",
    "under_rdzv",
]
__version__ = "0.1.0"

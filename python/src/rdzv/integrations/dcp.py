"""torch.distributed.checkpoint (DCP): save into a step directory that
appears whole, and load what rdzv chose.

    from rdzv.integrations import dcp as rdzv_dcp

    step = rdzv_dcp.load(state_dict) or 0              # None on a fresh start
    ...
    rdzv_dcp.save(state_dict, rdzv.checkpoint_dir(), step)   # on every rank

Every rank calls save and load, as DCP's own are collective. save writes
into checkpoint_dir/.step-N.tmp, then rank 0 renames it to
checkpoint_dir/step-N and marks it complete; a worker killed mid-save never
leaves a partial step-N.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Dict, Optional

import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp

import rdzv

__all__ = ["load", "save"]

_TRAILING_NUMBER = re.compile(r"([0-9]+)$")


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def save(state_dict: Dict[str, Any], checkpoint_dir: str, step: int, **kwargs: Any) -> str:
    """torch.distributed.checkpoint.save(state_dict) to checkpoint_dir/step-N
    on every rank; returns that path once it is in place and marked complete.
    kwargs go to torch.distributed.checkpoint.save (not checkpoint_id)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError("step must be an integer >= 0, got %r" % (step,))
    if not checkpoint_dir:
        raise ValueError("checkpoint_dir must be a directory, got %r" % (checkpoint_dir,))
    if "checkpoint_id" in kwargs:
        raise ValueError("checkpoint_id is chosen by rdzv.integrations.dcp.save, got %r" % (kwargs["checkpoint_id"],))
    # From here until it is complete (or training goes past it), a long
    # save is bounded by health.checkpoint_timeout, not progress_timeout.
    rdzv.checkpoint_begin(step)
    final = os.path.join(checkpoint_dir, "step-%d" % step)
    # One name all ranks agree on without talking; the leading dot keeps the
    # agent's scanner off it.
    tmp = os.path.join(checkpoint_dir, ".step-%d.tmp" % step)
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a worker killed mid-save
        os.makedirs(tmp)
    _barrier()
    # Collective: it returns once every rank's data and the metadata are
    # written.
    torch_dcp.save(state_dict, checkpoint_id=tmp, **kwargs)
    _barrier()
    if _rank() == 0:
        # An earlier generation may have reached the same step before failing.
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        rdzv.checkpoint_complete(final, step)
    _barrier()
    return final


def load(state_dict: Dict[str, Any], **kwargs: Any) -> Optional[int]:
    """torch.distributed.checkpoint.load(state_dict) in place from the
    checkpoint rdzv chose, on every rank; returns its step (the number its
    name ends in), or None on a fresh start, loading nothing. kwargs go to
    torch.distributed.checkpoint.load."""
    path = rdzv.resume_from()
    if path is None:
        return None
    m = _TRAILING_NUMBER.search(os.path.basename(os.path.normpath(path)))
    if m is None:
        raise ValueError("RDZV_RESUME_FROM must name a directory ending in its step, got %r" % (path,))
    torch_dcp.load(state_dict, checkpoint_id=path, **kwargs)
    return int(m.group(1))

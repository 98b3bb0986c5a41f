"""DeepSpeed: save and mark complete, and load what rdzv chose.

    from rdzv.integrations import deepspeed as rdzv_ds

    _, client_state = rdzv_ds.load_checkpoint(engine)          # (None, None) on a fresh start
    ...
    rdzv_ds.save_checkpoint(engine, rdzv.checkpoint_dir(), step)  # on every rank

DeepSpeed writes save_dir/global_stepN/ (every rank its shards) and the
`latest` file. save_checkpoint calls it on every rank, waits for all of
them, then marks save_dir/global_stepN complete on rank 0.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

import torch.distributed as dist

import rdzv

__all__ = ["load_checkpoint", "save_checkpoint"]


def save_checkpoint(engine: Any, save_dir: str, step: int, tag: Optional[str] = None,
                    client_state: Optional[Dict[str, Any]] = None) -> str:
    """engine.save_checkpoint(save_dir, tag, client_state) on every rank (it
    is collective), then rank 0 marks save_dir/tag complete. tag defaults to
    global_step<step>, so the directory's name carries the step rdzv
    resumes at. Returns the checkpoint's directory.

    With a decoupled (asynchronous) checkpoint engine the files are not
    written when save_checkpoint returns; the checkpoint is then not marked,
    and a warning says so once.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError("step must be an integer >= 0, got %r" % (step,))
    if not save_dir:
        raise ValueError("save_dir must be a directory, got %r" % (save_dir,))
    tag = "global_step%d" % step if tag is None else str(tag)
    # A long save is bounded by health.checkpoint_timeout until it is
    # complete (or, with a decoupled engine, until the next step report).
    rdzv.checkpoint_begin(step)
    engine.save_checkpoint(save_dir, tag=tag, client_state=client_state if client_state is not None else {})
    path = os.path.join(save_dir, tag)
    ckpt_engine = getattr(engine, "checkpoint_engine", None)
    if ckpt_engine is not None and getattr(ckpt_engine, "is_decoupled", lambda: False)():
        rdzv._core._warn("deepspeed-decoupled",
                         "a decoupled DeepSpeed checkpoint engine finishes saving later, so %s is not marked complete" % path)
        return path
    # DeepSpeed ends its save with a barrier; this one keeps that a promise
    # of ours rather than of its current code.
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        if dist.get_rank() != 0:
            return path
    rdzv.checkpoint_complete(path, step)
    return path


def load_checkpoint(engine: Any, **kwargs: Any) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
    """engine.load_checkpoint of the checkpoint rdzv chose (its directory
    as load_dir, its name as tag), returning DeepSpeed's (load_path,
    client_state); (None, None) on a fresh start. kwargs go to
    engine.load_checkpoint."""
    path = rdzv.resume_from()
    if path is None:
        return None, None
    path = os.path.normpath(path)
    load_path, client_state = engine.load_checkpoint(os.path.dirname(path), tag=os.path.basename(path), **kwargs)
    return load_path, client_state

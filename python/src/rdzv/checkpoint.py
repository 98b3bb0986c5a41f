"""In-memory checkpoints: each rank keeps its shard of the training state in
node-local shared memory, the rdzv agent copies it to a peer node, and after
a failure the job resumes from the newest step whose every shard survived,
rather than from its last durable checkpoint.

    import rdzv.checkpoint

    state = rdzv.checkpoint.load() or load_durable()   # None: not resumed from memory
    for step in range(start, steps + 1):
        train_one_step()
        rdzv.checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, step)

save() stalls the step only for copying the state's tensors to CPU memory;
serializing, writing and reporting run on a background thread, one save at
a time (a save waits for the previous one to finish first). The agent gives
each worker its directory in RDZV_MEMCKPT_DIR (under /dev/shm, the job
user's, 0700) and, after a recovery from memory, the step in
RDZV_RESUME_MEMORY. Without RDZV_MEMCKPT_DIR (not run by rdzv, or the job
has no checkpoint.memory) save() does nothing and load() returns None.

The state is what torch.save takes (state_dicts: tensors, numbers, strings,
lists and dicts of them); load() reads it with weights_only=True, and only
if that refuses the file (other objects pickled in) without it: the file is
the job's own, written by its own ranks.

A sharded state (FSDP2's, or DCP's get_state_dict(model, optim)) holds
DTensors: each is saved as this rank's shard with its sharding and device
mesh, as torch.save writes a DTensor, and set_state_dict(model, optim, ...)
takes load()'s state back when the world size and the sharding are the
same as when it was saved (docs/checkpoints.md, "With FSDP and DCP").

Like every rdzv report, nothing here raises for trouble with the agent or
the write: it is written to stderr once and training goes on. Bad arguments
raise ValueError.
"""

from __future__ import annotations

import copy
import hashlib
import io
import os
import sys
import threading
from typing import Any, Optional

from rdzv import _core

DIR_ENV = "RDZV_MEMCKPT_DIR"
RESUME_ENV = "RDZV_RESUME_MEMORY"


def shard_name(step: int, rank: int) -> str:
    """The file name of rank's shard of step in the directory: the agent
    looks for this name (agent/memckpt.go)."""
    return "step-%d-rank-%d.pt" % (step, rank)


def directory() -> Optional[str]:
    """This worker's in-memory checkpoint directory (RDZV_MEMCKPT_DIR), or
    None when in-memory checkpoints are off."""
    return os.environ.get(DIR_ENV) or None


def resume_step() -> Optional[int]:
    """The in-memory step rdzv restored for this generation
    (RDZV_RESUME_MEMORY), or None."""
    v = os.environ.get(RESUME_ENV, "")
    try:
        return int(v) if v else None
    except ValueError:
        return None


def rank() -> int:
    """This worker's global rank (RANK, as torchrun sets it), 0 alone."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


class _Saver:
    """At most one save in flight: the thread writing the previous one.
    The lock guards thread; a new save joins the old thread before it
    starts its own, outside the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: Optional[threading.Thread] = None

    def wait(self) -> None:
        with self.lock:
            t = self.thread
        if t is not None:
            t.join()


_saver = _Saver()


def _to_cpu(obj: Any) -> Any:
    """A copy of obj whose tensors are CPU copies: what training changes
    next must not change the saved state."""
    import torch

    # A DTensor stays one: its local shard copied to CPU, its sharding and
    # mesh kept, as DCP's own CPU staging copies it (no collective).
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        # The same kind of mapping (an OrderedDict stays one).
        return type(obj)((k, _to_cpu(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_cpu(v) for v in obj)
    if isinstance(obj, (int, float, str, bytes, bool, type(None))):
        return obj
    return copy.deepcopy(obj)


def save(state: Any, step: int) -> None:
    """Save this rank's state of step in node-local memory, in the
    background. Returns once the state's tensors are copied to CPU memory
    (after the previous save, if still in flight, finished). Call it on
    every rank with the same step; a step is restorable only when every
    rank saved it."""
    s = _core._check_step(step)
    d = directory()
    if d is None:
        return
    _saver.wait()
    snapshot = _to_cpu(state)
    r = rank()
    t = threading.Thread(target=_write, args=(d, snapshot, s, r), name="rdzv-memckpt", daemon=True)
    with _saver.lock:
        _saver.thread = t
    t.start()


def wait() -> None:
    """Wait for the save in flight, if any, to be written and reported: at
    the end of training, or before reading the file in a test."""
    _saver.wait()


def _write(directory: str, state: Any, step: int, rank: int) -> None:
    try:
        import torch

        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getbuffer()
        digest = hashlib.sha256(data).hexdigest()
        name = shard_name(step, rank)
        # A dot name until complete: the agent never takes a partial write
        # for a shard. Shared memory needs no fsync.
        tmp = os.path.join(directory, ".%s.tmp-%d" % (name, os.getpid()))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(directory, name))
        size = len(data)
        del data, buf
    except Exception as e:
        _core._warn("memckpt", e)
        return
    try:
        _core._post("memory", {"step": step, "rank": rank, "size": size, "sha256": digest})
    except Exception as e:
        _core._warn("memory", e)


def load() -> Optional[Any]:
    """This rank's state of the in-memory step rdzv restored, or None when
    the generation did not resume from memory (fresh start, or a durable
    checkpoint: see rdzv.resume_from)."""
    s = resume_step()
    d = directory()
    if s is None or d is None:
        return None
    import torch

    path = os.path.join(d, shard_name(s, rank()))
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception:
        pass
    # weights_only takes DTensors only once torch.distributed.tensor is
    # imported, which a script calling load() before it builds its sharded
    # model may not have done yet.
    if _import_dtensor():
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception:
            pass
    # Not plain tensors and containers; the job's own file.
    return torch.load(path, map_location="cpu", weights_only=False)


def _import_dtensor() -> bool:
    """Imports torch.distributed.tensor; False when it was already imported
    (nothing changed) or this torch has none."""
    if "torch.distributed.tensor" in sys.modules:
        return False
    try:
        import torch.distributed.tensor  # noqa: F401
    except Exception:  # a torch built without torch.distributed
        return False
    return True

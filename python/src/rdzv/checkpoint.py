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

With checkpoint.memory.persist_every: M in job.yaml, every save whose step
is a multiple of M is also written to the job's checkpoint.dir, on a
thread of its own that save() never waits for (a persist still running
when the next one is due skips that one): each rank writes
memory-step-N/gG-rank-R.pt (G its generation; fsynced, then renamed into
place), and the rank that finds every rank's file of its generation there
writes the COMPLETE marker, naming that generation, which the agent's
checkpoint scan recognises. A step is never made of two generations'
files: a fenced generation's late write neither completes nor changes
another's. Such a step is a durable checkpoint
like any other: when no in-memory step survives (the two nodes holding a
shard and its replica lost together), rdzv resumes from it, and load()
returns it. The two newest complete steps are kept; an older one is
removed once its COMPLETE is a minute old (the step rdzv would resume from
may trail the newest by a few), an older incomplete one at once.

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
# RESUME_WORLD_ENV is the world size that saved the step of RESUME_ENV;
# another than this generation's only for a job whose state is replicated
# (checkpoint.memory.replicated).
RESUME_WORLD_ENV = "RDZV_RESUME_MEMORY_WORLD"
PERSIST_ENV = "RDZV_MEMCKPT_PERSIST_EVERY"
# PERSISTED_PREFIX names a persisted step's directory in checkpoint.dir:
# memory-step-N, a name the agent's scan takes as step N.
PERSISTED_PREFIX = "memory-step-"
# PERSISTED_KEEP is how many complete persisted steps are always kept;
# an older complete one is removed only once its COMPLETE is
# PERSISTED_GRACE seconds old. The controller records a step when node
# rank 0's scan (every 2 s) reports it, so the step it would resume from
# may trail the newest complete ones by a few; it is never removed under
# it while training runs on.
PERSISTED_KEEP = 2
PERSISTED_GRACE = 60.0


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


def persist_every() -> int:
    """Every how many steps a save is also persisted to checkpoint.dir
    (RDZV_MEMCKPT_PERSIST_EVERY, job.yaml's
    checkpoint.memory.persist_every); 0 never."""
    try:
        return max(int(os.environ.get(PERSIST_ENV, "") or 0), 0)
    except ValueError:
        return 0


def world_size() -> int:
    """The job's world size (WORLD_SIZE, as torchrun sets it), 1 alone."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


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
# _persister is the persist in flight, if any; save() never waits for it.
_persister = _Saver()


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
    """Wait for the save in flight, if any, to be written and reported,
    and then for its persist to checkpoint.dir, if one runs: at the end of
    training, or before reading the file in a test."""
    _saver.wait()
    _persister.wait()


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
        path = os.path.join(directory, name)
        os.replace(tmp, path)
        size = len(data)
        del data, buf
    except Exception as e:
        _core._warn("memckpt", e)
        return
    _maybe_persist(path, step, rank)
    try:
        _core._post("memory", {"step": step, "rank": rank, "size": size, "sha256": digest})
    except Exception as e:
        _core._warn("memory", e)


def _maybe_persist(path: str, step: int, rank: int) -> None:
    """Start persisting the shard at path when step is due and no persist
    is in flight. The shard is opened here: the agent may evict it from
    memory before the persist reads it."""
    every, ckpt = persist_every(), _core.checkpoint_dir()
    if not every or not ckpt or step % every:
        return
    with _persister.lock:
        busy = _persister.thread is not None and _persister.thread.is_alive()
        if busy:
            _core._warn("persist_busy", "step %d not persisted: the previous persist is still being written" % step)
            return
        try:
            src = open(path, "rb")
        except OSError as e:
            _core._warn("persist", e)
            return
        t = threading.Thread(target=_persist, args=(src, ckpt, step, _core.generation(), rank, world_size()),
                             name="rdzv-persist", daemon=True)
        _persister.thread = t
    t.start()


def _persisted_name(generation: int, rank: int) -> str:
    return "g%d-rank-%d.pt" % (generation, rank)


def _persist(src: Any, ckpt: str, step: int, generation: int, rank: int, world: int) -> None:
    """Write the shard open in src as ckpt/memory-step-N/gG-rank-R.pt, then
    mark the step COMPLETE if every rank of generation G wrote its file."""
    try:
        with src:
            d = os.path.join(ckpt, PERSISTED_PREFIX + str(step))
            os.makedirs(d, mode=0o700, exist_ok=True)
            name = _persisted_name(generation, rank)
            tmp = os.path.join(d, ".%s.tmp-%d" % (name, os.getpid()))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                while True:
                    chunk = src.read(16 << 20)
                    if not chunk:
                        break
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(d, name))
            _fsync_dir(d)
        if not _complete_if_whole(d, step, generation, world):
            _prune_own(ckpt, step, generation, rank)
    except Exception as e:
        _core._warn("persist", e)


def _prune_own(ckpt: str, newest: int, generation: int, rank: int) -> None:
    """Remove this rank's files of steps older than the PERSISTED_KEEP
    newest it wrote that never completed. Where no step completes (a
    checkpoint.dir each node sees alone, which is no durable checkpoint
    of the job's), a rank keeps PERSISTED_KEEP files, not one per step; a
    complete step is _prune's."""
    name = _persisted_name(generation, rank)
    mine = []
    for n in os.listdir(ckpt):
        if n.startswith(PERSISTED_PREFIX) and n[len(PERSISTED_PREFIX):].isdigit():
            s = int(n[len(PERSISTED_PREFIX):])
            if s <= newest and os.path.isfile(os.path.join(ckpt, n, name)):
                mine.append((s, n))
    mine.sort()
    for s, n in mine[:-PERSISTED_KEEP]:
        if not os.path.isfile(os.path.join(ckpt, n, _core.MARKER)):
            try:
                os.unlink(os.path.join(ckpt, n, name))
                os.rmdir(os.path.join(ckpt, n))  # only once no rank's file is left
            except OSError:
                pass


def _complete_if_whole(d: str, step: int, generation: int, world: int) -> bool:
    """Write d's COMPLETE marker once every rank of generation has its
    file in d; whether d is complete. Each rank looks after writing its
    own, so the last to finish sees them all; the marker is created
    exclusively, so two that finish together write it once. Then older
    persisted steps are pruned (_prune)."""
    have = set(os.listdir(d))
    if any(_persisted_name(generation, r) not in have for r in range(world)):
        return False
    import json

    try:
        fd = os.open(os.path.join(d, _core.MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return True
    with os.fdopen(fd, "w") as f:
        json.dump({"step": step, "generation": generation, "world_size": world}, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(d)
    _prune(os.path.dirname(d), step)
    return True


def _prune(ckpt: str, newest: int) -> None:
    """Remove the persisted steps older than the PERSISTED_KEEP newest
    complete ones (newest, just completed, among them): an incomplete one
    at once, a complete one once its COMPLETE is PERSISTED_GRACE seconds
    old; never the one this generation resumed from."""
    import shutil
    import time

    steps = []
    for n in os.listdir(ckpt):
        if n.startswith(PERSISTED_PREFIX) and n[len(PERSISTED_PREFIX):].isdigit():
            steps.append((int(n[len(PERSISTED_PREFIX):]), n))
    complete = sorted(s for s, n in steps if s <= newest and os.path.isfile(os.path.join(ckpt, n, _core.MARKER)))
    if len(complete) < PERSISTED_KEEP:
        return
    floor = complete[-PERSISTED_KEEP]
    resumed = os.path.normpath(_core.resume_from() or "")
    for s, n in steps:
        d = os.path.join(ckpt, n)
        if s >= floor or os.path.normpath(d) == resumed:
            continue
        try:
            if time.time() - os.stat(os.path.join(d, _core.MARKER)).st_mtime < PERSISTED_GRACE:
                continue
        except FileNotFoundError:
            pass  # incomplete: never a checkpoint to resume from
        shutil.rmtree(d, ignore_errors=True)


def _fsync_dir(d: str) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load() -> Optional[Any]:
    """This rank's state of the in-memory step rdzv restored, or of the
    persisted one (checkpoint.memory.persist_every) it resumes from
    durably; None otherwise (a fresh start, or another durable checkpoint:
    see rdzv.resume_from). Saved by another world size (a job with
    checkpoint.memory.replicated whose world changed), a rank takes rank R
    modulo that size's shard, and a sharded state is refused."""
    s = resume_step()
    d = directory()
    if s is None or d is None:
        return _load_persisted()
    saved = _saved_world()
    if saved in (0, world_size()):
        return _load(os.path.join(d, shard_name(s, rank())))
    return _load_replicated(os.path.join(d, shard_name(s, rank() % saved)), saved,
                            "the job sets checkpoint.memory.replicated, which a sharded state must not")


def _saved_world() -> int:
    """RESUME_WORLD_ENV, 0 when unset (an older agent: the same world)."""
    try:
        return max(int(os.environ.get(RESUME_WORLD_ENV, "") or "0"), 0)
    except ValueError:
        return 0


def _load_persisted() -> Optional[Any]:
    """This rank's state of the persisted step the generation resumes
    from durably (rdzv.resume_from() names a memory-step-N directory), or
    None. Saved by another world size, a rank takes rank R modulo that
    size's shard: right for a replicated state (DDP's), refused for a
    sharded one."""
    src = _core.resume_from()
    if not src or not os.path.basename(os.path.normpath(src)).startswith(PERSISTED_PREFIX):
        return None
    import json

    with open(os.path.join(src, _core.MARKER)) as f:
        marker = json.load(f)
    saved, gen = int(marker["world_size"]), int(marker["generation"])
    r = rank()
    if saved == world_size():
        return _load(os.path.join(src, _persisted_name(gen, r)))
    return _load_replicated(os.path.join(src, _persisted_name(gen, r % saved)), saved,
                            "reshard it with torch.distributed.checkpoint")


def _load_replicated(path: str, saved: int, remedy: str) -> Any:
    """The state at path, saved by a world of saved ranks, for a rank of
    another world: only a replicated state fits, never a sharded one (the
    error says remedy)."""
    state = _load(path)
    if _has_dtensor(state):
        raise RuntimeError("%s was saved by %d ranks and holds sharded tensors (DTensor); %d ranks cannot load it "
                           "shard by shard: %s" % (path, saved, world_size(), remedy))
    return state


def _has_dtensor(obj: Any) -> bool:
    if isinstance(obj, dict):
        return any(_has_dtensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_dtensor(v) for v in obj)
    return type(obj).__name__ == "DTensor"


def _load(path: str) -> Any:
    import torch

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

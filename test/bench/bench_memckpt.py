"""Save stall and load time of about 1 GB of training state: rdzv's
in-memory checkpoint (rdzv.checkpoint.save / load, node-local shared
memory) beside a durable save to a directory on disk, measured in the same
run on the same state (`make bench-memckpt`; figures only, never a test).

For each of BENCH_REPEATS rounds (default 5) it measures:
  memory save stall    what rdzv.checkpoint.save blocks the training step
                       for: the copy of the state's tensors to CPU memory
  memory save, total   that plus the background serialize and write to
                       /dev/shm (the step is not blocked for it)
  durable save stall   torch.save to BENCH_DURABLE_DIR and fsync: what a
                       synchronous durable save blocks the step for
  memory load          rdzv.checkpoint.load of the step (from /dev/shm)
  durable load         torch.load of the durable file after its pages are
                       dropped from the page cache (posix_fadvise), as a
                       restarted node reads it

and prints the medians and the ratios durable / memory. The state is
BENCH_STATE_MB MB (default 1024) of float32 tensors of 64 MB each, like a
model's and its optimizer's. No agent is needed: without RDZV_AGENT_ADDR
the report after a save does nothing.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List

import torch

import rdzv.checkpoint


def timed(f: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def durable_save(state: Dict[str, torch.Tensor], path: str) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> int:
    mb = int(os.environ.get("BENCH_STATE_MB", "1024"))
    repeats = int(os.environ.get("BENCH_REPEATS", "5"))
    durable_dir = os.environ.get("BENCH_DURABLE_DIR", "/var/tmp")
    chunk = 64  # MB per tensor
    state = {"t%d" % i: torch.randn(min(chunk, mb - i * chunk) << 18) for i in range((mb + chunk - 1) // chunk)}
    size = sum(t.numel() * t.element_size() for t in state.values())

    shm = tempfile.mkdtemp(prefix="rdzv-bench-memckpt-", dir="/dev/shm")
    durable = tempfile.mkdtemp(prefix="rdzv-bench-durable-", dir=durable_dir)
    os.environ.update({"RDZV_MEMCKPT_DIR": shm, "RANK": "0"})
    os.environ.pop("RDZV_AGENT_ADDR", None)
    m: Dict[str, List[float]] = {k: [] for k in ("mem_stall", "mem_total", "durable_stall", "mem_load", "durable_load")}
    try:
        for step in range(1, repeats + 1):
            t0 = time.perf_counter()
            rdzv.checkpoint.save(state, step)
            m["mem_stall"].append(time.perf_counter() - t0)
            rdzv.checkpoint.wait()
            m["mem_total"].append(time.perf_counter() - t0)

            path = os.path.join(durable, "step-%d.pt" % step)
            m["durable_stall"].append(timed(lambda: durable_save(state, path)))

            os.environ["RDZV_RESUME_MEMORY"] = str(step)
            m["mem_load"].append(timed(rdzv.checkpoint.load))
            del os.environ["RDZV_RESUME_MEMORY"]
            drop_cache(path)
            m["durable_load"].append(timed(lambda: torch.load(path, map_location="cpu", weights_only=True)))
            os.unlink(path)
            os.unlink(os.path.join(shm, rdzv.checkpoint.shard_name(step, 0)))
    finally:
        for d in (shm, durable):
            for n in os.listdir(d):
                os.unlink(os.path.join(d, n))
            os.rmdir(d)

    med = {k: statistics.median(v) for k, v in m.items()}
    print("state: %.0f MB in %d float32 tensors; %d rounds; durable directory %s; torch %s; %d CPUs"
          % (size / 1e6, len(state), repeats, durable_dir, torch.__version__, os.cpu_count() or 0))
    print("| | median | range |")
    print("| --- | --- | --- |")
    for k, label in (("mem_stall", "in-memory save: stall of the step"), ("mem_total", "in-memory save: until written"),
                     ("durable_stall", "durable save (torch.save + fsync): stall of the step"),
                     ("mem_load", "in-memory load (/dev/shm)"), ("durable_load", "durable load (page cache dropped)")):
        print("| %s | %.3f s | %.3f-%.3f s |" % (label, med[k], min(m[k]), max(m[k])))
    print("- save stall: durable / in-memory = %.1fx" % (med["durable_stall"] / med["mem_stall"]))
    print("- load: durable / in-memory = %.1fx" % (med["durable_load"] / med["mem_load"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

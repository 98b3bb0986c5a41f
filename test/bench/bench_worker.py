"""Benchmark wrapper around examples/train.py (run by torchrun, under rdzv or
under torchrun's own elastic mode). It adds no training logic of its own:
it runs train.main() unchanged and hooks the per-step call train.py already
makes, rdzv.report_step, to

  - append one line per step to $BENCH_TICK_DIR/<hostname>.ticks:
      TICK host=<h> pid=<pid> started=<unix s> gen=<g> rank=<r> world=<n> step=<s> t=<unix s>
    where started is when this process began (before importing torch), so
    the benchmark can tell a restarted worker from one that was already
    running when the fault was injected, and world is the job's width (the
    goodput run weighs a step taken by fewer nodes by its width);
  - append PHASE lines to the same file when torch is imported and when the
    process group is up:
      PHASE host=<h> pid=<pid> started=<unix s> gen=<g> phase=imported|pg t=<unix s>
  - hang on request: when $BENCH_HANG_DIR/hang-<hostname> exists, remove it
    (so only this generation hangs) and sleep forever without exiting.

With BENCH_RESUME_LATEST=1 (torchrun elastic, which has no notion of a
checkpoint catalog) and no RDZV_RESUME_FROM, it resumes from the newest
complete step-<N> directory in $RDZV_CHECKPOINT_DIR, which is what a
restarted torchrun worker has to do for itself. Under rdzv the agent sets
RDZV_RESUME_FROM.

Under NVIDIA's ft_launcher (BENCH_NVRX=1) each step also sends the rank's
heartbeat to ft_launcher's rank monitor (RankMonitorClient), which is how
ft_launcher detects a hung rank; its own guide has the training loop call
send_heartbeat() once per iteration.

Durable checkpoints are train.py's torch.save into $RDZV_CHECKPOINT_DIR;
system rdzv-mem adds train.py's --memory-every 1 (rdzv.checkpoint.save every
step, rdzv.checkpoint.load on a resume from memory).

BENCH_STATE_MB=N (default 0) adds about N MB of optimizer-like state to
every checkpoint (a float32 tensor built from code, saved and loaded with
the model), so a checkpoint's write and load show in the recovery. It is not
trained, so a step costs the same; only checkpoints grow.

test/bench/bench_torchft.py imports this module for its TICK and PHASE
lines and its hang hook, so both workers are observed the same way.
"""

import os
import socket
import sys
import time

STARTED = time.time()

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "src"))

import rdzv  # noqa: E402  (python/src/rdzv)

HOST = socket.gethostname()
GEN = os.environ.get("RDZV_GENERATION") or "r" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
TICK_DIR = os.environ.get("BENCH_TICK_DIR", "")
HANG_FILE = os.path.join(os.environ.get("BENCH_HANG_DIR", "/nonexistent"), "hang-" + HOST)
_tick_fd = None


def _write(line):
    global _tick_fd
    if not TICK_DIR:
        return
    if _tick_fd is None:
        _tick_fd = os.open(os.path.join(TICK_DIR, HOST + ".ticks"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_tick_fd, line.encode())  # one O_APPEND write per line


def tick(step, extra=""):
    _write("TICK host=%s pid=%d started=%.6f gen=%s rank=%s world=%s step=%d t=%.6f%s\n" % (
        HOST, os.getpid(), STARTED, GEN, os.environ.get("RANK", "?"), os.environ.get("WORLD_SIZE", "0"), step, time.time(), extra))


def hang_if_asked(step):
    """Stop stepping without exiting when the benchmark asked this host to
    hang (the file is removed first, so only this generation hangs)."""
    if not os.path.exists(HANG_FILE):
        return
    try:
        os.remove(HANG_FILE)
    except OSError:
        pass
    tick(step, " hang=1")
    while True:
        time.sleep(3600)


def phase(name):
    """PHASE lines mark a worker's start-up, so the benchmark can split a
    recovery's tail into its parts: the process started (python up), torch
    imported, process group up."""
    _write("PHASE host=%s pid=%d started=%.6f gen=%s phase=%s t=%.6f\n" % (HOST, os.getpid(), STARTED, GEN, name, time.time()))


_report_step = rdzv.report_step
_nvrx = None
if os.environ.get("BENCH_NVRX") == "1":
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    _nvrx = RankMonitorClient()


def report_step(step, force=False, final=False, **metrics):
    tick(step)
    hang_if_asked(step)
    if _nvrx is not None:
        _nvrx.send_heartbeat()
    _report_step(step, force=force, final=final, **metrics)


rdzv.report_step = report_step

import train  # noqa: E402  (examples/train.py; it calls rdzv.report_step every step)

phase("imported")
_init_process_group = train.dist.init_process_group


def init_process_group(*args, **kwargs):
    out = _init_process_group(*args, **kwargs)
    phase("pg")
    return out


train.dist.init_process_group = init_process_group

if _nvrx is not None:
    # Connect to ft_launcher's rank monitor once per worker, when torch is up:
    # the initial heartbeat timeout covers the start-up before it.
    _nvrx.init_workload_monitoring()

STATE_MB = int(os.environ.get("BENCH_STATE_MB", "0"))


if STATE_MB > 0:
    # Large state: an extra tensor in every checkpoint, built from code (no
    # download), written by rank 0's torch.save and read by every rank's
    # torch.load on resume, like an optimizer's moments would be.
    extra_state = train.torch.ones(STATE_MB * (1 << 20) // 4)
    _torch_save, _torch_load = train.torch.save, train.torch.load

    def _save(obj, path, *args, **kwargs):
        if isinstance(obj, dict) and "opt" in obj:
            obj = dict(obj, bench_state=extra_state)
        return _torch_save(obj, path, *args, **kwargs)

    def _load(path, *args, **kwargs):
        out = _torch_load(path, *args, **kwargs)
        if isinstance(out, dict):
            out.pop("bench_state", None)
        return out

    train.torch.save, train.torch.load = _save, _load


def latest_complete(ckpt_dir):
    best, path = -1, ""
    try:
        names = os.listdir(ckpt_dir)
    except OSError:
        return ""
    for name in names:
        if not name.startswith("step-"):
            continue
        try:
            step = int(name[len("step-"):])
        except ValueError:
            continue
        p = os.path.join(ckpt_dir, name)
        if step > best and os.path.exists(os.path.join(p, rdzv.MARKER)):
            best, path = step, p
    return path


if os.environ.get("BENCH_RESUME_LATEST") == "1" and not os.environ.get("RDZV_RESUME_FROM"):
    os.environ["RDZV_RESUME_FROM"] = latest_complete(os.environ.get("RDZV_CHECKPOINT_DIR", ""))

if __name__ == "__main__":
    train.main()

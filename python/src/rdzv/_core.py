"""The client of the rdzv agent's report endpoint and the worker's rdzv
environment. Standard library only.

The agent passes every worker its endpoint in RDZV_AGENT_ADDR, its job and
generation in RDZV_JOB and RDZV_GENERATION, and the generation's report token
in RDZV_REPORT_TOKEN (sent as "Authorization: Bearer <token>"; keep it out of
logs). Without RDZV_AGENT_ADDR (a script run by hand or by plain torchrun)
nothing is sent.

No report ever raises: a failed report must not stop training. A failure is
written to stderr once per kind of report, and each report waits at most
about a second for the agent. Bad arguments raise ValueError, as they are
bugs in the caller rather than trouble with the agent.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import numbers
import os
import re
import sys
import threading
import time
from typing import Dict, Iterator, Optional, Set, Union


# MARKER is the file checkpoint_complete writes into a checkpoint directory:
# one of the agent's default checkpoint.markers, so its scan of
# checkpoint.dir finds the checkpoint complete even when the report is lost.
MARKER = "COMPLETE"

_TIMEOUT = 1.0
# report_step sends at most this often: the agent forwards one step per
# heartbeat, so more frequent reports would only cost the training loop.
_STEP_INTERVAL = 0.5
# After a failed step report, wait this long before trying again, so an agent
# that stopped answering does not cost every step a timeout.
_STEP_RETRY = 10.0

# The agent's bounds on a step report's metrics (wire/metrics.go).
MAX_METRICS = 16
MAX_METRIC_NAME = 64
_METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*\Z")

# The clock report_step rate limits by; tests replace it.
_monotonic = time.monotonic


class _State:
    """What the reports remember between calls; one lock guards it, as an
    integration may report from a saving thread beside the training loop.
    No I/O happens under the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_step_at = 0.0
        # The highest step seen, sent or not, for report_done.
        self.last_step = 0
        self.warned: Set[str] = set()


_state = _State()


def resume_from() -> Optional[str]:
    """The checkpoint directory rdzv chose for this generation to resume
    from (RDZV_RESUME_FROM), or None on a fresh start."""
    return os.environ.get("RDZV_RESUME_FROM") or None


def checkpoint_dir() -> Optional[str]:
    """The job's checkpoint.dir (RDZV_CHECKPOINT_DIR), or None when the job
    has none. Checkpoints reported to rdzv must be directories directly
    inside it whose names end in the step (step-40, checkpoint-40,
    global_step40)."""
    return os.environ.get("RDZV_CHECKPOINT_DIR") or None


def generation() -> int:
    """This worker's generation (RDZV_GENERATION), 0 when not run by rdzv."""
    try:
        return int(os.environ.get("RDZV_GENERATION", "0"))
    except ValueError:
        return 0


def under_rdzv() -> bool:
    """Whether an rdzv agent runs this worker, i.e. whether reports go
    anywhere."""
    return bool(os.environ.get("RDZV_AGENT_ADDR"))


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or int(step) < 0:
        raise ValueError("step must be an integer >= 0, got %r" % (step,))
    return int(step)


def report_step(step: int, *, force: bool = False, final: bool = False, **metrics: float) -> None:
    """Report that training reached step, an integer >= 0.

    Cheap enough to call every step: it sends at most every 0.5 s and other
    calls return at once; force=True always sends. final=True says step is
    the last one (as report_done does) and always sends: whatever follows,
    a final save or evaluation however long, is then never taken for a hang.
    rdzv's hang detection (health.progress_timeout) watches these reports.

    metrics (e.g. loss=2.31, lr=3e-4) must be real numbers, at most
    MAX_METRICS of them, named like Python identifiers (also with . / -) of
    at most MAX_METRIC_NAME characters; NaN and infinities are sent too.
    The latest show in `rdzvctl status NAME` and the dashboard. `force` and
    `final` cannot be metric names.
    """
    s = _check_step(step)
    fields = _metric_fields(metrics)
    _note_step(s)
    try:
        now = _monotonic()
        with _state.lock:
            if not force and not final and now < _state.next_step_at:
                return
            _state.next_step_at = now + _STEP_INTERVAL
        if final:
            fields["phase"] = "done"
        if not _post("step", dict(fields, step=s)):
            with _state.lock:
                _state.next_step_at = _monotonic() + _STEP_RETRY
    except Exception as e:  # never let reporting break training
        _warn("step", e)


def report_done(step: Optional[int] = None) -> None:
    """Report that training is over: step (by default the highest step
    reported so far) was the last. Call it after the last step, before the
    final save, evaluation and exit: rdzv then never takes them for a hang,
    and the workers' exit alone decides how the job ends."""
    s = _check_step(step) if step is not None else None
    with _state.lock:
        if s is None:
            s = _state.last_step
    _note_step(s)
    try:
        _post("step", {"step": s, "phase": "done"})
    except Exception as e:
        _warn("step", e)


def checkpoint_begin(step: int) -> None:
    """Report that saving the checkpoint of step begins, on every rank that
    saves (calling it on all ranks is fine). Until the save ends, rdzv's
    hang detection allows health.checkpoint_timeout rather than
    health.progress_timeout. The save ends with checkpoint_complete of this
    step (or a later one), or at the first step reported after it (a save
    that failed): no call is needed to end it."""
    s = _check_step(step)
    _note_step(s)
    try:
        _post("step", {"step": s, "phase": "saving"})
    except Exception as e:
        _warn("step", e)


@contextlib.contextmanager
def saving(step: int) -> Iterator[None]:
    """checkpoint_begin(step) for the block that saves the checkpoint:

        with rdzv.saving(step):
            path = save(step)
        if rank == 0:
            rdzv.checkpoint_complete(path, step)

    Leaving the block sends nothing: checkpoint_complete, or the next step
    reported, ends the save (see checkpoint_begin)."""
    checkpoint_begin(step)
    yield


def _note_step(step: int) -> None:
    with _state.lock:
        _state.last_step = max(_state.last_step, step)


def _metric_fields(metrics: Dict[str, object]) -> Dict[str, object]:
    """The step report's "metrics" member for metrics (none when empty).
    Non-finite values are spelled as strings, since JSON has no NaN."""
    if not metrics:
        return {}
    if len(metrics) > MAX_METRICS:
        raise ValueError("at most %d metrics are allowed, got %d" % (MAX_METRICS, len(metrics)))
    out: Dict[str, object] = {}
    for name, value in metrics.items():
        if len(name) > MAX_METRIC_NAME or not _METRIC_NAME.match(name):
            raise ValueError("metric name %r must be at most %d characters, a letter or _ then letters, digits, _ . / or -"
                             % (name, MAX_METRIC_NAME))
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError("metric %s must be a real number, got %r" % (name, value))
        v = float(value)
        if math.isnan(v):
            out[name] = "NaN"
        elif math.isinf(v):
            out[name] = "Infinity" if v > 0 else "-Infinity"
        else:
            out[name] = v
    return {"metrics": out}


def checkpoint_complete(path: Union[str, "os.PathLike[str]"], step: int) -> None:
    """Declare the checkpoint of step in directory path complete.

    Call it once, on one process (rank 0), after the save has returned on
    every rank. It writes the MARKER file (COMPLETE) into path unless there
    is one, atomically (a temporary file renamed into place), so that the
    agent's scan of checkpoint.dir recognises the checkpoint too, and then
    reports it to the agent, which enters it in the job's checkpoint catalog
    at once: a failure right after the save resumes from it. The marker is
    written even when not run by rdzv, so a later run under rdzv finds the
    checkpoint.

    path must be an existing directory; to be resumed from under rdzv it must
    lie directly inside checkpoint_dir() and its name end in the step. A
    failure to write the marker or to report is written to stderr and does
    not raise.
    """
    s = _check_step(step)
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError("path must be a checkpoint directory, got %r" % (path,))
    full = os.path.abspath(os.fspath(path))
    if not os.path.isdir(full):
        raise ValueError("path must be an existing checkpoint directory, got %r" % (os.fspath(path),))
    try:
        _write_marker(full, s)
    except Exception as e:
        _warn("marker", e)
    try:
        _post("checkpoint", {"step": s, "path": full})
    except Exception as e:
        _warn("checkpoint", e)


def _write_marker(directory: str, step: int) -> None:
    marker = os.path.join(directory, MARKER)
    if os.path.exists(marker):
        return
    # A dot name: should this process die mid-write, no scanner or saver
    # mistakes the remains for the marker.
    tmp = os.path.join(directory, ".%s.tmp-%d" % (MARKER, os.getpid()))
    with open(tmp, "w") as f:
        f.write("%d\n" % step)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, marker)


def _post(kind: str, fields: Dict[str, object]) -> bool:
    """Send one report; False when it failed (already warned about)."""
    addr = os.environ.get("RDZV_AGENT_ADDR", "")
    if not addr:
        return True
    try:
        host, _, port = addr.rpartition(":")
        body = dict(fields, job=os.environ.get("RDZV_JOB", ""), generation=int(os.environ.get("RDZV_GENERATION", "0")))
        conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=_TIMEOUT)
        try:
            headers = {"Content-Type": "application/json"}
            token = os.environ.get("RDZV_REPORT_TOKEN", "")
            if token:  # without, the agent's refusal says what is missing
                headers["Authorization"] = "Bearer " + token
            conn.request("POST", "/v1/" + kind, body=json.dumps(body), headers=headers)
            resp = conn.getresponse()
            reason = resp.read(1024).decode("utf-8", "replace").strip()
        finally:
            conn.close()
        if resp.status != 204:
            _warn(kind, "agent answered %d: %s" % (resp.status, reason))
            return False
        return True
    except Exception as e:
        _warn(kind, e)
        return False


_WHAT = {
    "step": "step report to the rdzv agent",
    "checkpoint": "checkpoint report to the rdzv agent",
    "marker": "writing the checkpoint's " + MARKER + " marker",
    "memory": "in-memory checkpoint report to the rdzv agent",
    "memckpt": "writing the in-memory checkpoint",
    "persist": "persisting the in-memory checkpoint to checkpoint.dir",
    "persist_busy": "persisting every checkpoint.memory.persist_every-th in-memory checkpoint",
}


def _warn(kind: str, err: object) -> None:
    with _state.lock:
        if kind in _state.warned:
            return
        _state.warned.add(kind)
    try:
        sys.stderr.write("rdzv: %s failed (not repeated): %s\n" % (_WHAT.get(kind, kind), err))
        sys.stderr.flush()
    except Exception:
        pass

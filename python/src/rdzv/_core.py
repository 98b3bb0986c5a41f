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

import http.client
import json
import numbers
import os
import sys
import threading
import time
from typing import Dict, Optional, Set, Union

__all__ = [
    "MARKER",
    "checkpoint_complete",
    "checkpoint_dir",
    "generation",
    "report_step",
    "resume_from",
    "under_rdzv",
]

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

# The clock report_step rate limits by; tests replace it.
_monotonic = time.monotonic


class _State:
    """What the reports remember between calls; one lock guards it, as an
    integration may report from a saving thread beside the training loop.
    No I/O happens under the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_step_at = 0.0
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


def report_step(step: int, *, force: bool = False, **metrics: float) -> None:
    """Report that training reached step, an integer >= 0.

    Cheap enough to call every step: it sends at most every 0.5 s and other
    calls return at once; force=True always sends, e.g. for the last step.
    rdzv's hang detection (health.progress_timeout) watches these reports.

    metrics (e.g. loss=2.31) must be real numbers. The agent does not take
    metrics yet, so they are checked and then not sent: passing them now
    costs nothing and keeps the call unchanged when it does.
    """
    s = _check_step(step)
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError("metric %s must be a real number, got %r" % (name, value))
    try:
        now = _monotonic()
        with _state.lock:
            if not force and now < _state.next_step_at:
                return
            _state.next_step_at = now + _STEP_INTERVAL
        if not _post("step", {"step": s}):
            with _state.lock:
                _state.next_step_at = _monotonic() + _STEP_RETRY
    except Exception as e:  # never let reporting break training
        _warn("step", e)


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

"""Report training progress and saved checkpoints to the local rdzv-agent.

Copy this file beside your training script (it needs only the standard
library) and call:

    import rdzv_report

    for step in range(start, steps + 1):
        train_one_step()
        rdzv_report.report_step(step)          # cheap: call it every step

    # rank 0, after the save has returned and its completion marker exists:
    rdzv_report.report_checkpoint(step, "/shared/ckpt/step-40")

Step reports are what rdzv's hang detection watches (health.progress_timeout):
a job whose workers never report has hang detection off. A checkpoint report
enters the job's checkpoint catalog at once, so a failure right after the
save resumes from it; the agent also scans checkpoint.dir, but only every few
seconds.

The agent passes its address in RDZV_AGENT_ADDR, the worker's job and
generation in RDZV_JOB and RDZV_GENERATION, and the generation's report
token in RDZV_REPORT_TOKEN: the agent accepts reports only with that token,
so keep it out of logs. Without RDZV_AGENT_ADDR (the script run by hand, or
by plain torchrun) every call does nothing.

No call ever raises: a failed report must not stop training. Failures are
written to stderr once per kind of report, and each call waits at most about
a second for the agent.
"""

import http.client
import json
import os
import sys
import time

__all__ = ["report_step", "report_checkpoint"]

_TIMEOUT = 1.0
# report_step sends at most this often: the agent forwards one step per
# heartbeat, so more frequent reports would only cost the training loop.
_STEP_INTERVAL = 0.5
# After a failed step report, wait this long before trying again, so an agent
# that stopped answering does not cost every step a timeout.
_STEP_RETRY = 10.0

_next_step_at = 0.0
_warned = set()


def report_step(step, force=False):
    """Report that training has reached step (an int >= 0).

    Sends at most every 0.5 s; other calls return at once. force=True always
    sends, e.g. for the last step."""
    global _next_step_at
    try:
        now = time.monotonic()
        if not force and now < _next_step_at:
            return
        _next_step_at = now + _STEP_INTERVAL
        if not _post("step", {"step": int(step)}):
            _next_step_at = time.monotonic() + _STEP_RETRY
    except Exception as e:  # never let reporting break training
        _warn("step", e)


def report_checkpoint(step, path):
    """Report a complete checkpoint of step saved at path (a directory
    inside the job's checkpoint.dir; without one the agent refuses checkpoint
    reports). Call it only after the save has returned and the checkpoint's
    completion marker is written."""
    try:
        _post("checkpoint", {"step": int(step), "path": os.path.abspath(path)})
    except Exception as e:
        _warn("checkpoint", e)


def _post(kind, fields):
    """Send one report; False when it failed (already warned about)."""
    addr = os.environ.get("RDZV_AGENT_ADDR", "")
    if not addr:
        return True
    try:
        host, _, port = addr.rpartition(":")
        body = dict(fields, job=os.environ.get("RDZV_JOB", ""),
                    generation=int(os.environ.get("RDZV_GENERATION", "0")))
        conn = http.client.HTTPConnection(host, int(port), timeout=_TIMEOUT)
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


def _warn(kind, err):
    if kind in _warned:
        return
    _warned.add(kind)
    try:
        sys.stderr.write("rdzv_report: %s report to the rdzv agent failed (not repeated): %s\n" % (kind, err))
        sys.stderr.flush()
    except Exception:
        pass

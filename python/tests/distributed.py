"""Runs a worker script in its own process as a one-rank torch.distributed
world, with the rdzv environment of the calling test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def run_worker(script: str, args: List[str], extra_env: Dict[str, str]) -> str:
    """Runs tests/workers/<script> and returns its stdout; fails the test
    with its output when it exits non-zero."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ)
    env.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "LOCAL_RANK": "0",
        "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p),
    })
    env.update(extra_env)
    proc = subprocess.run([sys.executable, str(HERE / "workers" / script)] + args, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, "%s exited %d:\n%s" % (script, proc.returncode, proc.stdout)
    return proc.stdout

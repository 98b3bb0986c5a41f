"""Runs a worker script in its own processes as a torch.distributed world
(one rank unless told), with the rdzv environment of the calling test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def run_worker(script: str, args: List[str], extra_env: Dict[str, str], world_size: int = 1) -> str:
    """Runs tests/workers/<script> as ranks 0..world_size-1 on this host and
    returns their stdout, rank 0's first; fails the test with every rank's
    output when one exits non-zero."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = []
    for rank in range(world_size):
        env = dict(os.environ)
        env.update({
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size), "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p),
        })
        env.update(extra_env)
        procs.append(subprocess.Popen([sys.executable, str(HERE / "workers" / script)] + args, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    assert not failed, "%s: ranks exited %s:\n%s" % (
        script, failed, "\n".join("--- rank %d\n%s" % (r, o) for r, o in enumerate(outs)))
    return "".join(outs)

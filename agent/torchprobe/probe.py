"""rdzv's torch probe: what this interpreter's torchrun is, read from it.

Run by the rdzv agent with the interpreter a job's launcher uses, as the
job's user, with the job's environment:

    python3 probe.py

It prints one JSON object on stdout:

    {"torch": torch.__version__,
     "python": [major, minor, micro],
     "options": [{"dest": ..., "strings": ["--opt", ...], "flag": bool}, ...],
     "std_bug": bool,
     "module": torch.__file__,
     "env": {NAME: value, ...}}

options are torchrun's parser's (torch.distributed.run.get_args_parser),
every spelling it accepts itself; flag is an option that takes no value.
std_bug is torch 1.x's Std.from_str on Python >= 3.11, which reads "0" and
"3" as None, so that torchrun without --redirects and --tee of 1 or 2 dies
starting its workers. env is what torchrun itself adds to a worker's
environment: the probe runs a real one-node, two-worker torchrun with
rdzv's static rendezvous on a free loopback port and a worker that only
dumps its environment (it imports nothing), in this process (torch is
imported once), and reports what the second worker got that the probe was
not given.
"""

import json
import os
import shutil
import socket
import sys
import tempfile

# Each worker writes its environment to $RDZV_PROBE_OUT/<LOCAL_RANK>.
WORKER = """import json, os
with open(os.path.join(os.environ["RDZV_PROBE_OUT"], os.environ["LOCAL_RANK"]), "w") as f:
    json.dump(dict(os.environ), f)
"""


def options():
    from torch.distributed.run import get_args_parser

    out = []
    for action in get_args_parser()._actions:
        if not action.option_strings:
            continue  # the training script and its arguments
        out.append({"dest": action.dest, "strings": list(action.option_strings), "flag": action.nargs == 0})
    return out


def std_bug():
    try:
        from torch.distributed.elastic.multiprocessing.api import Std
    except ImportError:
        return False
    return Std.from_str("0") is None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(needs_std):
    d = tempfile.mkdtemp(prefix="rdzv-probe-")
    try:
        script = os.path.join(d, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        given = dict(os.environ)
        os.environ["RDZV_PROBE_OUT"] = d
        argv = ["--nnodes", "1", "--node_rank", "0", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
        if needs_std:
            argv += ["--redirects", "2", "--tee", "2"]
        # In this process, which has imported torch already: a torchrun of
        # its own would import it again. Its output goes to stderr, away
        # from the answer.
        from torch.distributed.run import get_args_parser, run

        out = os.dup(1)
        os.dup2(2, 1)
        try:
            run(get_args_parser().parse_args(argv + [script]))
        except BaseException as e:  # ChildFailedError, SystemExit: reported below
            raise RuntimeError("torchrun failed: %s: %s" % (type(e).__name__, e)) from None
        finally:
            sys.stdout.flush()
            os.dup2(out, 1)
            os.close(out)
        given["RDZV_PROBE_OUT"] = d
        path = os.path.join(d, "1")
        if not os.path.exists(path):
            raise RuntimeError("torchrun's worker left no environment")
        with open(path) as f:
            got = json.load(f)
        return {k: v for k, v in got.items() if given.get(k) != v}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    import torch

    bug = std_bug()
    json.dump({"torch": torch.__version__, "python": list(sys.version_info[:3]), "options": options(),
               "std_bug": bug, "module": torch.__file__, "env": worker_env(bug)}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

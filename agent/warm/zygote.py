"""rdzv warm standby (launcher.kind warm): a zygote for one node's workers.

Started by the rdzv agent, through the worker's shim, as the job's user in
its workdir with the job's environment, before any assignment:

    python3 zygote.py SOCKET_DIR SOCKET_NAME MODULE... -- COMMAND...

COMMAND is the job's command, there for ps and the like to show what the
standby is for; what it runs is the assignment's. It imports the preload MODULEs (torch, torch.distributed: the seconds every
torchrun worker spends at its start), listens on SOCKET_DIR/SOCKET_NAME (a
directory only the job's user and root can enter) and waits. It runs no code
of the job's and touches no GPU before the agent's one message, a JSON line:

    {"argv": [script, args...] or ["-m", module, args...],
     "workers": [{"env": {...}}, ...]}   # one per local rank

It answers "ok", then forks one child per worker. Each child takes exactly
the environment given (torchrun's for a worker: the agent computes it) and
runs the script as __main__, as `python -u script args` would. The parent
then behaves as torchrun does towards its workers: when one fails, the
others get SIGTERM and, after a grace, SIGKILL; it exits with the first
failure's code (128+signal for a signal), or 0 when all succeeded. SIGTERM
and SIGINT to it are passed on to the workers. To the agent this process is
the generation's launcher, as torchrun would be.
"""

import importlib
import json
import os
import runpy
import signal
import socket
import sys

# As torchrun's: how long the other workers get between SIGTERM and SIGKILL
# once one has failed.
TERM_GRACE = 30
MAX_MESSAGE = 64 << 20


def main():
    sock_dir, sock_name = sys.argv[1], sys.argv[2]
    preload = sys.argv[3:sys.argv.index("--")] if "--" in sys.argv else sys.argv[3:]
    # torchrun runs its workers with python -u.
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True)
    for module in preload:
        importlib.import_module(module)
    msg = wait_for_assignment(sock_dir, sock_name)
    children = {}
    for local_rank, worker in enumerate(msg["workers"]):
        pid = os.fork()
        if pid == 0:
            run_worker(msg["argv"], worker["env"])  # never returns
        children[pid] = local_rank
    code = supervise(children)
    # Nothing of the job's ran in this process: skip the interpreter's
    # teardown (torch's modules take a while to finalise), so that the
    # agent learns of a failed worker at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def wait_for_assignment(sock_dir, sock_name):
    workdir = os.getcwd()
    # A relative name: the directory's path may be longer than a socket
    # path may be.
    os.chdir(sock_dir)
    ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ln.bind(sock_name)
    ln.listen(1)
    os.chdir(workdir)
    while True:
        conn, _ = ln.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n") and len(data) < MAX_MESSAGE:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
            try:
                msg = json.loads(data)
                if not isinstance(msg.get("argv"), list) or not msg["argv"] or not isinstance(msg.get("workers"), list):
                    raise ValueError("argv and workers are required")
            except ValueError as e:
                conn.sendall(("error: %s\n" % e).encode())
                continue
            ln.close()
            os.unlink(os.path.join(sock_dir, sock_name))
            conn.sendall(b"ok\n")
            return msg


def run_worker(argv, env):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    omp = env.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0 and "torch" in sys.modules:
        # The OpenMP runtime read the variable when torch was imported, in
        # the standby's environment; this worker's value is the one to keep.
        sys.modules["torch"].set_num_threads(int(omp))
    if argv[0] == "-m":
        sys.argv = [argv[1]] + list(argv[2:])
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")
    # The interpreter's own exit: atexit handlers and buffers, as for a
    # script that ran to its end; an exception or SystemExit leaves the
    # same way, with its traceback and code.
    sys.exit(0)


def exit_code(status):
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def supervise(children):
    """Waits for the workers as torchrun does; returns the exit code."""
    state = {"failed": None}

    def signal_all(sig):
        for pid in children:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def on_term(signum, _frame):
        signal_all(signum)
        if state["failed"] is None:
            state["failed"] = 128 + signum
        signal.alarm(TERM_GRACE)

    def on_alarm(_signum, _frame):
        signal_all(signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGALRM, on_alarm)
    while children:
        pid, status = os.wait()
        if pid not in children:
            continue
        del children[pid]
        code = exit_code(status)
        if code != 0 and state["failed"] is None:
            state["failed"] = code
            signal_all(signal.SIGTERM)
            signal.alarm(TERM_GRACE)
    return state["failed"] or 0


if __name__ == "__main__":
    main()

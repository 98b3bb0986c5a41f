"""rdzv warm standby (launcher.kind warm): a zygote for one node's workers.

Started by the rdzv agent, through the worker's shim, as the job's user in
its workdir with the job's environment, before any assignment:

    python3 zygote.py SOCKET_DIR SOCKET_NAME MODULE... -- COMMAND...

COMMAND is the job's command, there for ps and the like to show what the
standby is for; what it runs is the assignment's. It imports the preload
MODULEs (by default torch, torch.distributed, torch.nn.parallel and
torch._dynamo: the seconds every torchrun worker spends at its start and in
DistributedDataParallel's constructor); a MODULE ending in "?" is imported
only if it can be (the workers import it themselves otherwise), listens on SOCKET_DIR/SOCKET_NAME (a directory only the job's
user and root can enter) and waits. It takes a message only from a peer
(SO_PEERCRED) that is root (the agent) or its own user, who can do anything
it does anyway; anyone else is answered "error: ..." and the standby waits
on. It runs no code of the job's and touches no GPU before the agent's one
message, a JSON line:

    {"argv": [script, args...] or ["-m", module, args...],
     "workers": [{"env": {...}}, ...],   # one per local rank
     "store": {"addr": MASTER_ADDR, "port": MASTER_PORT, "serve": bool},
     "error_dir": DIR}                    # the workers' TORCHELASTIC_ERROR_FILEs

As torchrun's agents do, the standbys host the generation's TCPStore, not
the workers (they get TORCHELASTIC_USE_AGENT_STORE=True): the one of node
rank 0 ("serve") starts it before answering, in a child process of its own
that ignores SIGTERM and dies with the standby, so that the store is up
before any worker anywhere looks for it, and lives exactly as long as the
generation's launcher. The others fork their workers only once the store
accepts connections, as torchrun's agents connect to it before starting
theirs: torch 1.13's store client retries a refused connection only once a
second, and the assignments reach the nodes within milliseconds of each
other. A store that cannot start (its port taken since the agent probed it)
is the answer "error: ...", which fails the generation.

It answers "ok", then forks one child per worker. Each child takes exactly
the environment given (torchrun's for a worker: the agent computes it) and
runs the script as __main__, as `python -u script args` would. The parent
then behaves as torchrun does towards its workers: when one fails, the
others get SIGTERM and, after a grace, SIGKILL; it exits with the first
failure's code (128+signal for a signal), or 0 when all succeeded. SIGTERM
and SIGINT to it are passed on to the workers. To the agent this process is
the generation's launcher, as torchrun would be. As torchrun does, it
reports the first failed worker's error file (what torch's @record wrote)
on its stderr, and it removes the error files' directory when it exits.
"""

import importlib
import json
import os
import runpy
import shutil
import signal
import socket
import struct
import sys
import time

# As torchrun's: how long the other workers get between SIGTERM and SIGKILL
# once one has failed.
TERM_GRACE = 30
MAX_MESSAGE = 64 << 20
# How long a standby not serving the store waits for it before forking its
# workers anyway (their store clients then wait on their own): only the
# skew between the nodes' hand-offs is meant to be covered.
STORE_WAIT = 10
PR_SET_PDEATHSIG = 1


def main():
    sock_dir, sock_name = sys.argv[1], sys.argv[2]
    preload = sys.argv[3:sys.argv.index("--")] if "--" in sys.argv else sys.argv[3:]
    # torchrun runs its workers with python -u.
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True)
    for module in preload:
        optional = module.endswith("?")
        try:
            importlib.import_module(module.rstrip("?"))
        except ImportError as e:
            if not optional:
                raise
            print("rdzv warm standby: optional preload %s not imported: %s" % (module, e), file=sys.stderr)
    msg = wait_for_assignment(sock_dir, sock_name)
    if not msg["store"]["serve"]:
        wait_for_store(msg["store"]["addr"], msg["store"]["port"])
    children = {}
    for local_rank, worker in enumerate(msg["workers"]):
        pid = os.fork()
        if pid == 0:
            run_worker(msg["argv"], worker["env"])  # never returns
        children[pid] = local_rank
    code, failed = supervise(children)
    error_dir = msg.get("error_dir") or ""
    if failed is not None:
        report_error(failed, msg["workers"][failed]["env"])
    if error_dir:
        shutil.rmtree(error_dir, ignore_errors=True)
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
            _, uid, _ = struct.unpack("i2I", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("i2I")))
            if uid not in (0, os.getuid()):
                conn.sendall(b"error: uid %d may not hand this standby its assignment\n" % uid)
                continue
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
                store = msg.get("store")
                if not isinstance(store, dict) or not isinstance(store.get("addr"), str) or not isinstance(store.get("port"), int):
                    raise ValueError("store with addr and port is required")
                if store.get("serve"):
                    serve_store(store["addr"], store["port"], (ln, conn))
            except (ValueError, OSError) as e:
                conn.sendall(("error: %s\n" % e).encode())
                continue
            ln.close()
            os.unlink(os.path.join(sock_dir, sock_name))
            conn.sendall(b"ok\n")
            return msg


def serve_store(addr, port, inherited):
    """Starts the generation's TCPStore in a child; returns once it listens.

    A child rather than a thread of this process: the workers are forked
    from this one, and a fork would copy the store's sockets and its
    destructor (to join a thread the copy does not have), not its thread.
    inherited are this process's sockets, which the child closes.
    """
    parent = os.getpid()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        for s in inherited:
            s.close()
        try:
            # torchrun's store lives in torchrun, so its workers keep it
            # through their SIGTERM grace: this one ends with the standby.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            import ctypes
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(1)  # the standby died before prctl took
            import torch.distributed
            store = torch.distributed.TCPStore(addr, port, None, True, wait_for_workers=False)
            os.write(w, b"ok")
        except BaseException as e:  # nothing else runs in this process: the standby reports it
            os.write(w, ("%s: %s" % (type(e).__name__, e)).encode())
            os._exit(1)
        os.close(w)
        while True:  # the store's own thread serves; this frame keeps it
            signal.pause()
    os.close(w)
    with os.fdopen(r, "rb") as f:
        answer = f.read().decode(errors="replace")
    if answer != "ok":
        os.waitpid(pid, 0)
        # One line: the agent reads the answer up to its newline.
        raise OSError("starting the store on port %d: %s" % (port, " ".join(answer.split()) or "its process died"))


def wait_for_store(addr, port):
    deadline = time.monotonic() + STORE_WAIT
    while time.monotonic() < deadline:
        try:
            socket.create_connection((addr, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.01)


def report_error(local_rank, env):
    """Prints what torch's @record wrote for the failed worker, if it did."""
    path = env.get("TORCHELASTIC_ERROR_FILE", "")
    try:
        with open(path) as f:
            err = json.load(f)["message"]
        message = err["message"] if isinstance(err, dict) else err
    except (OSError, ValueError, KeyError, TypeError):
        return
    sys.stderr.write("rdzv warm standby: local rank %d (rank %s) failed: %s\n" % (local_rank, env.get("RANK"), message))


def run_worker(argv, env):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    error_file = env.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        # torch's @record writes it, but does not create its directory.
        os.makedirs(os.path.dirname(error_file), exist_ok=True)
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
    """Waits for the workers as torchrun does.

    Returns the exit code, and the local rank of the first worker that
    failed (None when none did, or the standby was told to stop).
    """
    state = {"failed": None, "rank": None}

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
        local_rank = children.pop(pid)
        code = exit_code(status)
        if code != 0 and state["failed"] is None:
            state["failed"], state["rank"] = code, local_rank
            signal_all(signal.SIGTERM)
            signal.alarm(TERM_GRACE)
    return state["failed"] or 0, state["rank"]


if __name__ == "__main__":
    main()

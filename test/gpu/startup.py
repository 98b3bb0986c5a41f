"""Where a GPU worker's start-up goes, phase by phase, in a fresh process
(docs/gpu-check.md, "Where a restart's time goes on a GPU").

A warm standby (launcher.kind warm) saves a restarted worker the Python and
torch import; it cannot create the CUDA context or the NCCL communicator
before it forks (CUDA does not survive fork), so every worker of a new
generation pays those. This prints each phase's seconds for one rank on GPU
0 (world size 1, a TCPStore on loopback), so the figures in the docs can be
measured again on any GPU machine:

  python3 test/gpu/startup.py [--runs 3] [--preload MODULE...]

--preload imports the modules with torch, in the "import" phase, as a warm
standby's preload does before the fork (torch._dynamo: what
DistributedDataParallel's constructor imports otherwise).

One line per run: STARTUP import=<s> cuda_context=<s> init_process_group=<s>
first_allreduce=<s> ddp=<s> first_step=<s>. Each run is a new process, as a
restarted worker is.
"""

import argparse
import os
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(preload: list[str]) -> None:
    t0 = time.perf_counter()
    import importlib

    import torch

    for m in preload:
        importlib.import_module(m)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    marks = [("import", time.perf_counter())]
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # creates the context
    torch.cuda.synchronize(device)
    marks.append(("cuda_context", time.perf_counter()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    marks.append(("init_process_group", time.perf_counter()))
    t = torch.ones(1, device=device)
    dist.all_reduce(t)  # NCCL creates its communicator on the first collective
    torch.cuda.synchronize(device)
    marks.append(("first_allreduce", time.perf_counter()))
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[0])
    marks.append(("ddp", time.perf_counter()))
    x = torch.randn(256, 256, device=device)
    ddp(x).sum().backward()
    torch.cuda.synchronize(device)
    marks.append(("first_step", time.perf_counter()))
    dist.destroy_process_group()
    prev, fields = t0, []
    for name, at in marks:
        fields.append(f"{name}={at - prev:.3f}")
        prev = at
    print("STARTUP", *fields, f"total={prev - t0:.3f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--preload", nargs="*", default=[])
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        one_run(args.preload)
        return
    for _ in range(args.runs):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        subprocess.run([sys.executable, __file__, "--one", "--preload", *args.preload], env=env, check=True)


if __name__ == "__main__":
    main()

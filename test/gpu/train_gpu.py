"""The GPU check's training job (test/gpu/check.sh): a small model trained
with DDP over NCCL on the node's GPUs (gloo on CPU with GPU_CHECK_CPU=1),
checkpointed and resumed with the rdzv package.

It prints machine-readable lines check.sh looks for:
  GPU_CHECK_WORKER rank=<r> generation=<g> pid=<p> cuda=<0|1> visible=<CUDA_VISIBLE_DEVICES>
      device=<name> backend=<b>
  GPU_CHECK_ALLREDUCE generation=<g> bytes=<n> seconds=<s> busbw_gbps=<f>
      (rank 0, world size above 1)
  GPU_CHECK_RESUMED rank=<r> generation=<g> step=<s> source=<durable|memory> [path=<dir>]
  GPU_CHECK_STEP rank=<r> generation=<g> step=<s> loss=<f>   every step
  GPU_CHECK_DONE rank=<r> generation=<g> steps=<n>

With --require-cuda a worker without CUDA, or without CUDA_VISIBLE_DEVICES,
exits 3 before training: the check must not pass on a node whose GPUs rdzv
did not hand to the job. With --memory-every N every rank saves its model
and optimizer state (CUDA tensors on a GPU) with rdzv.checkpoint.save every N
steps and, when rdzv restores an in-memory step, resumes from it onto its
device. With GPU_CHECK_PIDS set, each worker writes its pid
to GPU_CHECK_PIDS/<generation>.<rank>.
"""

import argparse
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import rdzv


def log(*fields: str) -> None:
    # One write per line: ranks share stdout.
    sys.stdout.write(" ".join(fields) + "\n")
    sys.stdout.flush()


def save(ckpt_dir: str, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> str:
    final = os.path.join(ckpt_dir, f"step-{step}")
    tmp = os.path.join(ckpt_dir, f".step-{step}.tmp-{os.getpid()}")
    os.makedirs(tmp)
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(tmp, "model.pt"))
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    return final


def allreduce_busbw(device: torch.device, world: int, nbytes: int, iters: int) -> tuple[float, float]:
    """Seconds per all-reduce of nbytes of float32, and the bus bandwidth
    in GB/s as nccl-tests counts it (2(n-1)/n of the data per rank)."""
    t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    for _ in range(3):  # warm-up: NCCL sets up its rings on the first call
        dist.all_reduce(t)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    secs = (time.perf_counter() - start) / iters
    return secs, nbytes * 2 * (world - 1) / world / secs / 1e9


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--require-cuda", action="store_true")
    p.add_argument("--allreduce-bytes", type=int, default=64 << 20)
    p.add_argument("--memory-every", type=int, default=0)
    args = p.parse_args()

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    generation = os.environ.get("RDZV_GENERATION", "")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    pid_dir = os.environ.get("GPU_CHECK_PIDS", "")
    if pid_dir:  # check.sh finds the workers by these (a warm standby's children include its store)
        with open(os.path.join(pid_dir, f"{generation}.{rank}"), "w") as f:
            f.write(f"{os.getpid()}\n")
    log("GPU_CHECK_WORKER", f"rank={rank}", f"generation={generation}", f"pid={os.getpid()}", f"cuda={int(cuda)}",
        f"visible={visible}", f"device={name.replace(' ', '_')}", f"backend={backend}")
    if args.require_cuda and (not cuda or not visible):
        log("GPU_CHECK_FAIL", f"rank={rank}", f"cuda={int(cuda)}", f"visible={visible}")
        sys.exit(3)
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend)

    if world > 1 and args.allreduce_bytes > 0:
        secs, busbw = allreduce_busbw(device, world, args.allreduce_bytes, 10)
        if rank == 0:
            log("GPU_CHECK_ALLREDUCE", f"generation={generation}", f"bytes={args.allreduce_bytes}",
                f"seconds={secs:.6f}", f"busbw_gbps={busbw:.2f}")

    torch.manual_seed(0)
    x = torch.randn(4096, 256, device=device)
    y = x @ torch.randn(256, 1, device=device)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
    # Momentum: the optimizer has state of its own (on the device) to save.
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 1
    resume = rdzv.resume_from()
    state = rdzv.checkpoint.load() if args.memory_every else None
    if state is not None:
        # Saved from the device, restored as CPU tensors: load_state_dict
        # copies them back onto the model's and optimizer's device.
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        on = {t.device.type for t in opt.state_dict()["state"][0].values() if isinstance(t, torch.Tensor)}
        log("GPU_CHECK_RESUMED", f"rank={rank}", f"generation={generation}", f"step={state['step']}", "source=memory",
            f"optimizer_on={','.join(sorted(on))}")
    elif resume:
        ckpt = torch.load(os.path.join(resume, "model.pt"), map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start = ckpt["step"] + 1
        log("GPU_CHECK_RESUMED", f"rank={rank}", f"generation={generation}", f"step={ckpt['step']}", "source=durable",
            f"path={resume}")
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    ckpt_dir = rdzv.checkpoint_dir()
    if rank == 0 and ckpt_dir:
        os.makedirs(ckpt_dir, exist_ok=True)

    for step in range(start, args.steps + 1):
        batch = torch.arange(256, device=device) + (step * 256 + rank * 64) % 3840
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x[batch]), y[batch])
        loss.backward()
        opt.step()
        log("GPU_CHECK_STEP", f"rank={rank}", f"generation={generation}", f"step={step}", f"loss={loss.item():.6f}")
        if rank == 0 and ckpt_dir and step % args.checkpoint_every == 0:
            rdzv.checkpoint_complete(save(ckpt_dir, step, model, opt), step)
        if args.memory_every and step % args.memory_every == 0:
            rdzv.checkpoint.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, step)
        rdzv.report_step(step, force=step == args.steps)
        time.sleep(args.step_time)
    rdzv.checkpoint.wait()
    log("GPU_CHECK_DONE", f"rank={rank}", f"generation={generation}", f"steps={args.steps}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

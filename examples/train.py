"""Tiny DDP job for rdzv: linear regression on CPU with gloo, run by torchrun.

It prints machine-readable lines the e2e tests look for:
  RDZV_WORKER ... once per rank at start
  RDZV_RESUMED rank=<r> step=<s> [source=memory|persisted]   when resuming from a checkpoint
  RDZV_STEP rank=<r> step=<s> loss=<f>  every 10 steps
  RDZV_DONE rank=<r> steps=<n> first_loss=<f> final_loss=<f>
  RDZV_TICK rank=<r> generation=<g> step=<s> time=<unix seconds>
      after every step, with --tick (tests time each generation by them)
  RDZV_FAIL rank=<r> reason=fail-at-start  with --fail-at-start, which exits 3

With RDZV_CHECKPOINT_DIR set, rank 0 saves <dir>/step-<N>/model.pt every
--checkpoint-every steps. A step directory is built under a temporary name and
renamed into place, so a killed worker never leaves a partial step-<N>; it is
complete once rdzv.checkpoint_complete has written its COMPLETE marker.
RDZV_RESUME_FROM (rdzv.resume_from()) names the step directory to continue
from. The directory must be shared by all nodes, since every rank reads the
checkpoint it resumes from.

Every rank reports its step and loss to the rdzv agent with the rdzv Python
package (python/ in this repository), which is what rdzv's hang detection
watches, and the last step as final; rank 0 also reports each checkpoint's
save and, once it is complete, the checkpoint. Run without rdzv, the reports
do nothing.
"""

import argparse
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

try:
    import rdzv
except ImportError:  # not installed (e.g. Debian's python3): this checkout's copy
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "src"))
    import rdzv

FEATURES = 8
SAMPLES = 1024
BATCH = 32


def log(*fields):
    # One write per line: ranks share stdout, and print() writes the line and
    # its newline separately, letting another rank's line land in between.
    sys.stdout.write(" ".join(fields) + "\n")
    sys.stdout.flush()


def save_checkpoint(ckpt_dir, step, model, opt):
    final = os.path.join(ckpt_dir, f"step-{step}")
    tmp = os.path.join(ckpt_dir, f".step-{step}.tmp-{os.getpid()}")
    os.makedirs(tmp)
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()},
               os.path.join(tmp, "model.pt"))
    # An earlier generation may have reached the same step before failing.
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    return final


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-time", type=float, default=0.05, help="seconds to sleep per step")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--tick", action="store_true",
                   help="print an RDZV_TICK line for every step (fault-tolerance tests time generations by them)")
    p.add_argument("--memory-every", type=int, default=0,
                   help="save an in-memory checkpoint (rdzv.checkpoint) every this many steps (0: never), "
                        "and resume from the one rdzv restored")
    p.add_argument("--memory-generations", type=int, default=0,
                   help="save in memory only in generations up to this one (0: all): a later generation then "
                        "fails, as far as memory goes, before its first save")
    p.add_argument("--fail-at-start", action="store_true",
                   help="exit with status 3 before training: a job that crash loops")
    p.add_argument("--hang-file", default="",
                   help="stop making progress, without exiting, while PATH.<generation> exists: a hung job")
    p.add_argument("--final-save-time", type=float, default=0.0,
                   help="seconds to spend after the last step, as a long final save would")
    args = p.parse_args()

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    generation = os.environ.get("RDZV_GENERATION", "")
    log("RDZV_WORKER", f"rank={rank}", f"world_size={world_size}",
        f"node_rank={os.environ.get('GROUP_RANK', '')}",
        f"local_rank={os.environ.get('LOCAL_RANK', '')}",
        f"node={os.environ.get('RDZV_NODE', '')}",
        f"generation={generation}",
        f"job={os.environ.get('RDZV_JOB', '')}")
    if args.fail_at_start:
        log("RDZV_FAIL", f"rank={rank}", "reason=fail-at-start")
        sys.exit(3)

    dist.init_process_group("gloo")  # env://, from torchrun's MASTER_ADDR/PORT

    # Same seed everywhere: every rank builds the same data set and model.
    torch.manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES)
    y = x @ torch.randn(FEATURES, 1) + 0.01 * torch.randn(SAMPLES, 1)
    shard = torch.arange(rank, SAMPLES, world_size)  # like DistributedSampler
    model = torch.nn.Linear(FEATURES, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    start = 1
    resume_from = rdzv.resume_from()
    state = rdzv.checkpoint.load() if args.memory_every else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        # From memory, or from a step saved in memory and persisted to
        # checkpoint.dir (checkpoint.memory.persist_every).
        source = "memory" if rdzv.checkpoint.resume_step() is not None else "persisted"
        log("RDZV_RESUMED", f"rank={rank}", f"step={state['step']}", f"source={source}")
    elif resume_from:
        ckpt = torch.load(os.path.join(resume_from, "model.pt"))
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start = ckpt["step"] + 1
        log("RDZV_RESUMED", f"rank={rank}", f"step={ckpt['step']}")

    ddp = DistributedDataParallel(model)
    ckpt_dir = rdzv.checkpoint_dir()
    if rank == 0 and ckpt_dir:
        os.makedirs(ckpt_dir, exist_ok=True)

    first_loss = loss = None
    for step in range(start, args.steps + 1):
        while args.hang_file and os.path.exists(f"{args.hang_file}.{generation}"):
            time.sleep(0.5)
        # Batches depend on the step alone, so a resumed run sees the data
        # the interrupted one would have.
        batch = shard[(torch.arange(BATCH) + step * BATCH) % len(shard)]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x[batch]), y[batch])
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        if first_loss is None:
            first_loss = loss.item()
        if args.tick:
            log("RDZV_TICK", f"rank={rank}", f"generation={generation}", f"step={step}", f"time={time.time():.6f}")
        if step % 10 == 0:
            log("RDZV_STEP", f"rank={rank}", f"step={step}", f"loss={loss.item():.6f}")
        if rank == 0 and ckpt_dir and step % args.checkpoint_every == 0:
            with rdzv.saving(step):  # a slow save is bounded by health.checkpoint_timeout
                path = save_checkpoint(ckpt_dir, step, model, opt)
            # After torch.save returned: the marker vouches for a whole model.pt.
            rdzv.checkpoint_complete(path, step)
        # The last step is final: what follows (the final save, the exit) is
        # never taken for a hang.
        rdzv.report_step(step, final=step == args.steps, loss=loss.item())
        saves = not args.memory_generations or int(generation or 0) <= args.memory_generations
        if args.memory_every and saves and step % args.memory_every == 0:
            rdzv.checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, step)
        time.sleep(args.step_time)

    rdzv.checkpoint.wait()
    if args.final_save_time > 0:
        time.sleep(args.final_save_time)

    final_loss = loss.item() if loss is not None else float("nan")
    if first_loss is None:  # resumed at or past the last step
        first_loss = final_loss
    log("RDZV_DONE", f"rank={rank}", f"steps={args.steps}",
        f"first_loss={first_loss:.6f}", f"final_loss={final_loss:.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

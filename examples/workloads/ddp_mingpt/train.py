"""DDP of a minGPT-style character model, for torchrun (or rdzv's warm
launcher): CPU and gloo, or CUDA and NCCL where there are GPUs.

rank 0 saves a torch.save checkpoint into <RDZV_CHECKPOINT_DIR>/step-<N>/
every --checkpoint-every steps, built under a dot name and renamed into
place, and marks it complete with rdzv.checkpoint_complete; a restarted
generation loads rdzv.resume_from(). See ../charlm.py for what it prints.
"""

import argparse
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import charlm  # noqa: E402
import rdzv  # noqa: E402


def save(ckpt_dir: str, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> str:
    rdzv.checkpoint_begin(step)  # until complete, bounded by health.checkpoint_timeout
    final = os.path.join(ckpt_dir, "step-%d" % step)
    tmp = os.path.join(ckpt_dir, ".step-%d.tmp-%d" % (step, os.getpid()))
    os.makedirs(tmp)
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(tmp, "model.pt"))
    # An earlier generation may have saved the same step before it failed.
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    rdzv.checkpoint_complete(final, step)
    return final


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--batch", type=int, default=12, help="global batch, over the whole world")
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step (tests stretch the run)")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    data = charlm.corpus()
    model = charlm.MiniGPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    start = 1
    path = rdzv.resume_from()
    if path:
        ckpt = torch.load(os.path.join(path, "model.pt"), map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start = ckpt["step"] + 1
        if rank == 0:
            charlm.log("RDZV_RESUMED", step=ckpt["step"], path=path, generation=charlm.generation())

    ddp = DistributedDataParallel(model)
    ckpt_dir = rdzv.checkpoint_dir()
    if rank == 0 and ckpt_dir:
        os.makedirs(ckpt_dir, exist_ok=True)

    loss_value = float("nan")
    for step in range(start, args.steps + 1):
        x, y = charlm.global_batch(data, step, args.batch, model.block)
        x, y = charlm.shard(x, rank, world).to(device), charlm.shard(y, rank, world).to(device)
        opt.zero_grad()
        loss = ddp(x, y)
        loss.backward()  # DDP averages the gradients over the world here
        opt.step()
        loss_value = charlm.finite(charlm.world_mean(loss, len(x)))
        if rank == 0:
            charlm.log("RDZV_LOSS", step=step, loss=loss_value, generation=charlm.generation(), world=world)
            if ckpt_dir and step % args.checkpoint_every == 0:
                save(ckpt_dir, step, model, opt)
        rdzv.report_step(step, final=step == args.steps, loss=loss_value)
        time.sleep(args.step_time)

    if rank == 0:
        charlm.log("RDZV_DONE", steps=args.steps, final_loss=loss_value, generation=charlm.generation())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

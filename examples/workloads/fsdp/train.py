"""FSDP of the minGPT-style character model (../charlm.py), for torchrun
(or rdzv's warm launcher): torch 2.x's fully_shard (FSDP2) on CPU with
gloo, or CUDA with NCCL where there are GPUs.

Checkpoints are torch.distributed.checkpoint (DCP) directories, every rank
writing its shards: rdzv.integrations.dcp.save writes
<RDZV_CHECKPOINT_DIR>/step-<N>/ and marks it complete once every rank's
save has returned; a restarted generation, on any number of nodes, loads
rdzv's choice with rdzv.integrations.dcp.load, which reshards it.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import charlm  # noqa: E402
import rdzv  # noqa: E402
from rdzv.integrations import dcp  # noqa: E402


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
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda") if cuda else torch.device("cpu")

    torch.manual_seed(0)
    data = charlm.corpus()
    model = charlm.MiniGPT().to(device)
    # Each block its own FSDP unit, then the rest: parameters are gathered
    # one block at a time, as in a model too big for one device.
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    start = 1
    model_sd, opt_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": opt_sd}
    step = dcp.load(state)
    if step is not None:
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = step + 1
        if rank == 0:
            charlm.log("RDZV_RESUMED", step=step, path=rdzv.resume_from(), generation=charlm.generation())

    ckpt_dir = rdzv.checkpoint_dir()
    loss_value = float("nan")
    for step in range(start, args.steps + 1):
        x, y = charlm.global_batch(data, step, args.batch, model.block)
        x, y = charlm.shard(x, rank, world).to(device), charlm.shard(y, rank, world).to(device)
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()  # FSDP reduce-scatters the gradients here
        opt.step()
        loss_value = charlm.finite(charlm.world_mean(loss, len(x)))
        if rank == 0:
            charlm.log("RDZV_LOSS", step=step, loss=loss_value, generation=charlm.generation(), world=world)
        if ckpt_dir and step % args.checkpoint_every == 0:
            model_sd, opt_sd = get_state_dict(model, opt)
            dcp.save({"model": model_sd, "optim": opt_sd}, ckpt_dir, step)  # every rank
        rdzv.report_step(step, final=step == args.steps, loss=loss_value)
        time.sleep(args.step_time)

    if rank == 0:
        charlm.log("RDZV_DONE", steps=args.steps, final_loss=loss_value, generation=charlm.generation())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

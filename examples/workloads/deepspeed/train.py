"""DeepSpeed ZeRO (stage 2 or 3) of the minGPT-style character model
(../charlm.py), for the deepspeed launcher (or torchrun, or rdzv's warm
launcher: DeepSpeed reads torchrun's environment). On a machine without
GPUs DeepSpeed picks its CPU accelerator, and the workers talk over gloo.

Checkpoints are DeepSpeed's own: rdzv.integrations.deepspeed.save_checkpoint
has every rank write its partition of <RDZV_CHECKPOINT_DIR>/global_step<N>/
and marks it complete; a restarted generation, on any number of nodes,
loads rdzv's choice with rdzv.integrations.deepspeed.load_checkpoint.
DeepSpeed loads a ZeRO checkpoint only into as many ranks as saved it, so
the job keeps its size (see job.yaml).
"""

import argparse
import importlib
import os
import sys
import time

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import charlm  # noqa: E402
import rdzv  # noqa: E402
from rdzv.integrations import deepspeed as rdzv_ds  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--zero-stage", type=int, choices=(2, 3), default=2)
    p.add_argument("--batch", type=int, default=12, help="global batch, over the whole world")
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step (tests stretch the run)")
    # Given by the deepspeed launcher; torchrun gives LOCAL_RANK instead.
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args()

    accel = get_accelerator()
    if accel.device_name() == "cpu":
        # The CPU accelerator compiles a C++ extension (its shared-memory
        # all-reduce between ranks of one node) when the communicator starts:
        # minutes on a small machine, for nothing across nodes over gloo.
        # (deepspeed.comm.torch as an attribute is torch itself, which
        # deepspeed.comm imports by that name.)
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    # The CPU accelerator's own backend is oneCCL, which needs Intel's
    # extension; gloo comes with torch.
    deepspeed.init_distributed(dist_backend="gloo" if accel.device_name() == "cpu" else accel.communication_backend_name())
    rank, world = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()

    torch.manual_seed(0)
    data = charlm.corpus()
    model = charlm.MiniGPT()
    if args.batch % world:
        raise SystemExit("--batch %d must be a multiple of the world size %d" % (args.batch, world))
    config = {
        "train_batch_size": args.batch,
        "train_micro_batch_size_per_gpu": args.batch // world,
        "gradient_accumulation_steps": 1,
        # torch's AdamW: DeepSpeed's fused and CPU Adam are extensions that
        # would be compiled at start.
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "torch_adam": True}},
        "zero_optimization": {"stage": args.zero_stage},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    device = engine.device

    start = 1
    path, client = rdzv_ds.load_checkpoint(engine)
    if path is not None:
        start = client["step"] + 1
        if rank == 0:
            charlm.log("RDZV_RESUMED", step=client["step"], path=rdzv.resume_from(), generation=charlm.generation())

    ckpt_dir = rdzv.checkpoint_dir()
    loss_value = float("nan")
    for step in range(start, args.steps + 1):
        x, y = charlm.global_batch(data, step, args.batch, model.block)
        x, y = charlm.shard(x, rank, world).to(device), charlm.shard(y, rank, world).to(device)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        loss_value = charlm.finite(charlm.world_mean(loss, len(x)))
        if rank == 0:
            charlm.log("RDZV_LOSS", step=step, loss=loss_value, generation=charlm.generation(), world=world)
        if ckpt_dir and step % args.checkpoint_every == 0:
            rdzv_ds.save_checkpoint(engine, ckpt_dir, step, client_state={"step": step})  # every rank
        rdzv.report_step(step, final=step == args.steps, loss=loss_value)
        time.sleep(args.step_time)

    if rank == 0:
        charlm.log("RDZV_DONE", steps=args.steps, final_loss=loss_value, generation=charlm.generation())


if __name__ == "__main__":
    main()

"""The benchmark's training job under torchft: examples/train.py's model,
data, step time and checkpoint interval, with torchft's Manager around the
step instead of one DDP job over every node.

Each host is one replica group of one process (REPLICA_GROUP_ID=0..2),
launched by torchrun so that a worker that dies is restarted in place, as
torchft's own examples (train_ddp.py) run it. The Manager joins the quorum
the lighthouse ($TORCHFT_LIGHTHOUSE) issues, all-reduces gradients across
the replica groups in it, and commits a step only if every participant
finished it (should_commit). A replica group that (re)joins behind the
others recovers the model and optimizer from a live peer, not from a
checkpoint; the surviving groups keep training at reduced width meanwhile.

It writes the same TICK and PHASE lines as bench_worker.py (whose module it
imports for them and for the hang hook), one TICK per committed step, with
the quorum it was committed in:
  TICK ... step=<committed steps> t=<unix s> quorum=<id> participants=<n>
Replica group 0 also saves a checkpoint every --checkpoint-every committed
steps, as train.py's rank 0 does, so the step costs the same. A replica
group reads the newest one back when it starts, as a user's script would
(torchft's train_ddp.py example does not): that is what lets the job go on
when every group restarted at once (a crash of all of them); a group that
rejoins live peers starts behind them and recovers from a peer all the
same.

Settings, and why (torchft's docs and its train_ddp.py example):
  - Manager(min_replica_size=BENCH_TORCHFT_MIN, 2 like rdzv's nodes.min):
    a step commits with at least this many replica groups.
  - timeout=BENCH_TORCHFT_TIMEOUT s (5 like rdzv's progress timeout): bounds
    every collective and should_commit, which is how a hung or cut-off
    peer is noticed by the others; the default 60 s would wait a minute.
  - quorum_timeout 30 s: longer than a step, as the docs ask, so a slow
    quorum is not mistaken for a split brain.
  - use_async_quorum (default True): the quorum overlaps the forward pass.
"""

import argparse
import os
import sys
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_worker as bw  # noqa: E402  (TICK/PHASE lines, hang hook; imports train)

train = bw.train
torch = train.torch

from torchft import Manager, ProcessGroupGloo  # noqa: E402
from torchft.ddp import DistributedDataParallel  # noqa: E402

REPLICA = int(os.environ["REPLICA_GROUP_ID"])
REPLICAS = int(os.environ.get("NUM_REPLICA_GROUPS", "3"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=20)
    args = p.parse_args()

    timeout = timedelta(seconds=float(os.environ.get("BENCH_TORCHFT_TIMEOUT", "5")))
    torch.manual_seed(0)
    x = torch.randn(train.SAMPLES, train.FEATURES)
    y = x @ torch.randn(train.FEATURES, 1) + 0.01 * torch.randn(train.SAMPLES, 1)
    # The same shards as train.py's three ranks: replica group i is rank i.
    shard = torch.arange(REPLICA, train.SAMPLES, REPLICAS)
    model = torch.nn.Linear(train.FEATURES, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def state_dict():
        sd = {"model": model.state_dict(), "opt": opt.state_dict()}
        if bw.STATE_MB > 0:
            # The large-state workload's extra state is the replica's too:
            # a rejoining group heals it from a live peer, as it would an
            # optimizer's moments, not only from a checkpoint.
            sd["bench_state"] = bw.extra_state
        return sd

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])
        if "bench_state" in sd:  # a peer's; a checkpoint's load drops it
            bw.extra_state.copy_(sd["bench_state"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        min_replica_size=int(os.environ.get("BENCH_TORCHFT_MIN", "2")),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"bench_{REPLICA}",
        timeout=timeout,
        quorum_timeout=timedelta(seconds=30),
        connect_timeout=timedelta(seconds=10),
    )
    bw.phase("pg")  # the Manager is up: the counterpart of a process group
    ddp = DistributedDataParallel(manager, model)
    ckpt_dir = os.environ.get("RDZV_CHECKPOINT_DIR", "")
    if REPLICA == 0 and ckpt_dir:
        os.makedirs(ckpt_dir, exist_ok=True)
    resume = bw.latest_complete(ckpt_dir) if ckpt_dir else ""
    if resume:
        ckpt = torch.load(os.path.join(resume, "model.pt"))
        load_state_dict(ckpt)
        # The Manager's step is the committed step count, which the
        # checkpoint's step is; batches_committed is only reported.
        manager.load_state_dict({"step": ckpt["step"], "batches_committed": ckpt["step"] * REPLICAS})
        print("RDZV_RESUMED replica=%d step=%d" % (REPLICA, ckpt["step"]), flush=True)

    while manager.current_step() < args.steps:
        step = manager.current_step() + 1
        batch = shard[(torch.arange(train.BATCH) + step * train.BATCH) % len(shard)]
        opt.zero_grad()
        manager.start_quorum()
        loss = torch.nn.functional.mse_loss(ddp(x[batch]), y[batch])
        loss.backward()  # torchft's DDP all-reduces across the quorum
        if manager.should_commit():
            opt.step()
            bw.tick(manager.current_step(), " quorum=%d participants=%d" % (manager._quorum_id, manager.num_participants()))
            if REPLICA == 0 and ckpt_dir and step % args.checkpoint_every == 0:
                path = train.save_checkpoint(ckpt_dir, step, model, opt)
                with open(os.path.join(path, bw.rdzv.MARKER), "w"):
                    pass
        bw.hang_if_asked(manager.current_step())
        bw.time.sleep(args.step_time)


if __name__ == "__main__":
    main()

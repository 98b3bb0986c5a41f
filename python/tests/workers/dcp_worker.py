"""Run by test_dcp.py in its own process (a one-rank gloo world): save a
model's state with rdzv.integrations.dcp, or, with RDZV_RESUME_FROM set,
load it first and print LOADED <step> <weight sum>."""

import sys

import torch
import torch.distributed as dist

from rdzv.integrations import dcp as rdzv_dcp


def main() -> None:
    ckpt_dir, step = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 1)
    state = {"model": model.state_dict()}
    loaded = rdzv_dcp.load(state)
    if loaded is not None:
        model.load_state_dict(state["model"])
        print("LOADED", loaded, float(model.weight.sum()), flush=True)
    else:
        with torch.no_grad():
            model.weight.fill_(0.25)
    print("SAVED", rdzv_dcp.save({"model": model.state_dict()}, ckpt_dir, step), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

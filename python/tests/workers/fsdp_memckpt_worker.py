"""Run by test_checkpoint_dcp.py as each rank of a two-rank gloo world: a
small model sharded with FSDP2 (fully_shard) and Adam, its state taken with
DCP's get_state_dict and kept with rdzv.checkpoint.

save STEPS OUT: trains STEPS steps, saving in memory after each, and writes
what each rank holds of the last step's state (its local shards, as plain
tensors) to OUT/expected-rank-R.pt.

load OUT: reads the step rdzv resumed (RDZV_RESUME_MEMORY) with
rdzv.checkpoint.load() first thing, as a script would before building its
model (torch.distributed.tensor not yet imported), then builds the model
afresh (other initial weights, no optimizer state), restores it with
set_state_dict and writes what each rank then holds to
OUT/restored-rank-R.pt.

Both print DONE <step> <rank>; load also prints WEIGHTS_ONLY <bool>, whether
every torch.load it made was weights_only.

FSDP_MEMCKPT_DEVICE=cuda runs it on the GPUs (NCCL, a CUDA mesh, one GPU per
rank): the state saved is then CUDA DTensors, copied to CPU by rdzv; on a GPU
machine, docs/gpu-check.md says how."""

import os
import sys
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist

import rdzv.checkpoint


def local(obj: Any) -> Any:
    """obj with every DTensor replaced by a CPU copy of this rank's shard,
    and its sharding written beside it."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return {"local": obj.to_local().detach().cpu().clone(), "placements": repr(obj.placements),
                "shape": list(obj.shape)}
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: local(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [local(v) for v in obj]
    return obj


DEVICE = os.environ.get("FSDP_MEMCKPT_DEVICE", "cpu")


def build(seed: int) -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    mesh = init_device_mesh(DEVICE, (dist.get_world_size(),))
    # Dimensions that do not divide by two: uneven shards (one rank's is
    # padded) must come back as they were.
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3)).to(DEVICE)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def main() -> None:
    mode, out = sys.argv[1], sys.argv[-1]
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
    rank = dist.get_rank()
    state: Dict[str, Any]
    if mode == "save":
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, opt = build(seed=1)
        steps = int(sys.argv[2])
        for step in range(1, steps + 1):
            torch.manual_seed(100 + step)
            model(torch.randn(4, 5).to(DEVICE)).square().sum().backward()
            opt.step()
            opt.zero_grad()
            msd, osd = get_state_dict(model, opt)
            rdzv.checkpoint.save({"model": msd, "optim": osd, "step": step}, step)
        rdzv.checkpoint.wait()
        msd, osd = get_state_dict(model, opt)
        torch.save(local({"model": msd, "optim": osd, "step": steps}), os.path.join(out, "expected-rank-%d.pt" % rank))
        print("DONE", steps, rank, flush=True)
    else:
        assert "torch.distributed.tensor" not in sys.modules
        weights_only: List[bool] = []
        real_load = torch.load

        def recording_load(*args: Any, **kwargs: Any) -> Any:
            weights_only.append(bool(kwargs.get("weights_only")))
            return real_load(*args, **kwargs)

        torch.load = recording_load  # type: ignore[assignment]
        loaded = rdzv.checkpoint.load()
        torch.load = real_load  # type: ignore[assignment]
        print("WEIGHTS_ONLY", all(weights_only), flush=True)
        assert loaded is not None, "not resumed from memory"
        state = loaded

        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model, opt = build(seed=2)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        msd, osd = get_state_dict(model, opt)
        torch.save(local({"model": msd, "optim": osd, "step": state["step"]}),
                   os.path.join(out, "restored-rank-%d.pt" % rank))
        print("DONE", state["step"], rank, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

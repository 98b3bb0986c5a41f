"""Run by test_deepspeed.py in its own process (a one-rank gloo world):
train a tiny model under a DeepSpeed ZeRO-2 engine on CPU and save with
rdzv.integrations.deepspeed, or, with RDZV_RESUME_FROM set, load first.
Prints RESUMED <load_path> <client_state step> when it loaded."""

import sys

import deepspeed
import torch

from rdzv.integrations import deepspeed as rdzv_ds


def main() -> None:
    save_dir, steps = sys.argv[1], int(sys.argv[2])
    # DeepSpeed's CPU backend would JIT-compile its shared memory all-reduce
    # (minutes of C++ on a test machine) that one rank never uses.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                           config=config)
    load_path, client_state = rdzv_ds.load_checkpoint(engine)
    start = 1
    if load_path is not None:
        assert client_state is not None
        start = client_state["step"] + 1
        print("RESUMED", load_path, client_state["step"], flush=True)
    x = torch.randn(4, 4)
    for step in range(start, steps + 1):
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
        if step % 2 == 0:
            rdzv_ds.save_checkpoint(engine, save_dir, step, client_state={"step": step})


if __name__ == "__main__":
    main()

"""In-memory checkpoints of a job sharded with FSDP2, its state taken and
restored with DCP's get_state_dict/set_state_dict: two real gloo ranks save
every step, two new ones (same world, same ranks) restore the last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import Agent
from distributed import run_worker

pytestmark = pytest.mark.frameworks
torch = pytest.importorskip("torch")
fsdp = pytest.importorskip("torch.distributed.fsdp")
pytest.importorskip("torch.distributed.checkpoint.state_dict")
if not hasattr(fsdp, "fully_shard"):
    pytest.skip("FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6", allow_module_level=True)


def assert_same(got: Any, want: Any, path: str = "") -> None:
    assert type(got) is type(want), "%s: %s, want %s" % (path, type(got), type(want))
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, "%s: %s %s, want %s %s" % (
            path, got.dtype, tuple(got.shape), want.dtype, tuple(want.shape))
        assert torch.equal(got, want), "%s: %s, want %s" % (path, got, want)
    elif isinstance(want, dict):
        assert sorted(got, key=str) == sorted(want, key=str), "%s: keys %s, want %s" % (path, list(got), list(want))
        for k in want:
            assert_same(got[k], want[k], "%s/%s" % (path, k))
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, "%s/%d" % (path, i))
    else:
        assert got == want, "%s: %r, want %r" % (path, got, want)


def test_fsdp2_state_restored_from_memory(agent: Agent, tmp_path: Path) -> None:
    # One directory for both ranks, as on one node.
    memdir = tmp_path / "mem"
    memdir.mkdir(mode=0o700)
    out = run_worker("fsdp_memckpt_worker.py", ["save", "3", str(tmp_path)], {"RDZV_MEMCKPT_DIR": str(memdir)},
                     world_size=2)
    assert "DONE 3 0\n" in out and "DONE 3 1\n" in out
    assert sorted(p.name for p in memdir.iterdir()) == sorted(
        "step-%d-rank-%d.pt" % (s, r) for s in (1, 2, 3) for r in (0, 1))
    assert sorted((b["step"], b["rank"]) for b in agent.bodies("/v1/memory")) == [
        (s, r) for s in (1, 2, 3) for r in (0, 1)]

    out = run_worker("fsdp_memckpt_worker.py", ["load", str(tmp_path)],
                     {"RDZV_MEMCKPT_DIR": str(memdir), "RDZV_RESUME_MEMORY": "3"}, world_size=2)
    assert "DONE 3 0\n" in out and "DONE 3 1\n" in out
    # load() read the DTensors with weights_only, though the script had not
    # imported torch.distributed.tensor yet.
    assert out.count("WEIGHTS_ONLY True\n") == 2, out
    from torch.distributed.tensor import DTensor

    for r in (0, 1):
        want = torch.load(tmp_path / ("expected-rank-%d.pt" % r), weights_only=True)
        # A rank's shard in memory is its own part only, as DCP's per-rank
        # files are.
        shard = torch.load(memdir / ("step-3-rank-%d.pt" % r), weights_only=True)
        w = shard["model"]["0.weight"]
        assert isinstance(w, DTensor) and w.shape == (7, 5)
        assert_same(w.to_local(), want["model"]["0.weight"]["local"], "rank %d shard" % r)
        assert w.to_local().shape == ((4, 5) if r == 0 else (3, 5))
        got = torch.load(tmp_path / ("restored-rank-%d.pt" % r), weights_only=True)
        # Each rank holds only its shard; Adam's state is there too.
        assert want["model"]["0.weight"]["placements"] == "(Shard(dim=0),)"
        assert want["model"]["0.weight"]["shape"] == [7, 5]
        assert set(want["optim"]["state"]["0.weight"]) == {"step", "exp_avg", "exp_avg_sq"}
        assert_same(got, want, "rank %d" % r)

    # Another world (one rank here): the saved mesh is not the model's, and
    # set_state_dict refuses it rather than loading rank 0's shard as the
    # whole.
    with pytest.raises(AssertionError, match="different meshes"):
        run_worker("fsdp_memckpt_worker.py", ["load", str(tmp_path)],
                   {"RDZV_MEMCKPT_DIR": str(memdir), "RDZV_RESUME_MEMORY": "3"}, world_size=1)

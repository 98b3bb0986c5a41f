"""rdzv's round smoke test (job.yaml health.preflight).

Run by every node's agent, as the job's user, before torchrun: a short gloo
all-reduce among the round's nodes, then a timed transfer over links to
each node's next and next-but-one neighbours, so that a slow or broken
node is found before training starts. Exit codes: 0 this node passed (the
training command follows), 87 this node is too slow and must be left out,
anything else the test itself failed (the attempt fails as any other).
One line starting "rdzv preflight: " on stdout carries the verdict.
"""

import argparse
import datetime
import sys
import time

EXCLUDED = 87


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--addr", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--min-mbps", type=float, required=True)
    p.add_argument("--timeout", type=float, required=True)
    a = p.parse_args()
    started = time.monotonic()

    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method="tcp://%s:%d" % (a.addr, a.port), rank=a.rank,
        world_size=a.world, timeout=datetime.timedelta(seconds=a.timeout))
    n, r = a.world, a.rank
    numel = max(a.bytes // 4, 1)
    size = numel * 4
    buf = torch.ones(numel)
    dist.all_reduce(buf)  # warm-up: connections are set up lazily
    dist.barrier()
    t = time.monotonic()
    dist.all_reduce(buf)
    allreduce = time.monotonic() - t

    # mbps[src][dst]: the link src -> dst as its receiver measured it. Each
    # node sends to its next and next-but-one neighbour, so that every node
    # has two links out and two in (one each with two nodes).
    mbps = torch.zeros(n, n, dtype=torch.float64)
    out, inp = torch.ones(numel), torch.empty(numel)
    # In two phases, so that a node does not send and receive at once:
    # its own outgoing data would delay the acknowledgements of what it
    # receives, and a slow sender would make its peers' links look slow too
    # (with two nodes, both; then neither is left out).
    for shift in sorted({1, 2} & set(range(1, n))):
        src, dst = (r - shift) % n, (r + shift) % n
        for phase in (0, 1):
            dist.barrier()
            t = time.monotonic()
            send = dist.isend(out, dst) if (r // shift) % 2 == phase else None
            if (src // shift) % 2 == phase:
                dist.irecv(inp, src).wait()
                mbps[src][r] = size * 8 / max(time.monotonic() - t, 1e-9) / 1e6
            if send is not None:
                send.wait()
    dist.all_reduce(mbps)  # every entry was set by one node only

    links = [(s, d) for s in range(n) for d in range(n) if mbps[s][d] > 0]
    slow = {(s, d) for (s, d) in links if mbps[s][d] < a.min_mbps}

    def all_slow(node, end):
        mine = [l for l in links if l[end] == node]
        return bool(mine) and all(l in slow for l in mine)

    # A node whose every link out is slow is the culprit (its sending side,
    # where a degraded NIC or a shaped link shows first); failing that, one
    # whose every link in is. Never every node: that is the network, not a
    # node, and leaving everyone out helps nobody.
    bad = {x for x in range(n) if all_slow(x, 0)} or {x for x in range(n) if all_slow(x, 1)}
    if len(bad) == n:
        bad = set()
    dist.barrier()
    dist.destroy_process_group()

    mine_out = ", ".join("to rank %d %.0f Mbit/s" % (d, mbps[s][d]) for (s, d) in links if s == r)
    verdict = "excluded: links below %.0f Mbit/s" % a.min_mbps if r in bad else "ok"
    print("rdzv preflight: rank %d of %d: %s; all-reduce of %d bytes in %.1f ms; %s; took %.1f s"
          % (r, n, verdict, size, allreduce * 1e3, mine_out, time.monotonic() - started), flush=True)
    return EXCLUDED if r in bad else 0


if __name__ == "__main__":
    sys.exit(main())

# Sums rank+1 over all ranks with gloo and prints the result, proving that
# torchrun's rendezvous and gloo's transport work between namespaces.
import socket
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
# One write, so that lines of ranks sharing stdout cannot interleave.
sys.stdout.write(f"ALLREDUCE rank={dist.get_rank()} world_size={dist.get_world_size()} "
                 f"host={socket.gethostname()} sum={int(t.item())}\n")
sys.stdout.flush()
dist.destroy_process_group()

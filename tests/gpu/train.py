"""A small deterministic PyTorch training loop for tests/gpu/run.sh.

Prints "STEP <i> <loss repr> <bytes allocated>" after each step. With NBOS_STEP_SYNC=1
it then waits for a line on stdin, so the host can revoke (checkpoint) and restore the
process's GPU memory between steps; the loss curve must equal the undisturbed run's."""
import os
import sys

import torch

torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = False
steps = int(os.environ.get("STEPS", "8"))
sync = os.environ.get("NBOS_STEP_SYNC") == "1"
dev = torch.device("cuda:0")
# ~1 GiB of state on the GPU so eviction and restore have something to move.
ballast = torch.ones(256 * 1024 * 1024, device=dev)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(512, 1024, device=dev)
y = torch.randint(0, 10, (512,), device=dev)
print(f"DEVICES {torch.cuda.device_count()}", flush=True)
for i in range(steps):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    ballast.mul_(1.0)
    print(f"STEP {i} {loss.item()!r} {torch.cuda.memory_allocated()}", flush=True)
    if sync and i + 1 < steps and not sys.stdin.readline():
        break
print(f"BALLAST {float(ballast[-1])}", flush=True)

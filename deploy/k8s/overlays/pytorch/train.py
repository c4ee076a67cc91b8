"""An example PyTorch training script for Downpour on Kubernetes: an MLP
(784-256-10) on Fashion-MNIST, one worker per pod of the Indexed Job
(components/pytorch-workers), parameters in Downpour tables under the
job's policy. Replace it with your own; it runs the same under
`python3 -m downpour.run --nproc=2 train.py` on one machine.

It needs no arguments: downpour.JobMember.join() and Client.connect() read
the environment contract (DOWNPOUR_SCHEDULER, DOWNPOUR_RANK, the secret),
and the job's ConfigMap gives STEPS and BATCH. A replacement pod resumes
at its rank's clock (model.clock) on the batches that step would have had.
Rank 0 logs the test accuracy at the end ("clock N: ... test accuracy A").
"""

import gzip
import os
import signal
import sys

import numpy as np
import torch
import torch.nn.functional as F

import downpour
import downpour.torch as dpt

DATA = os.environ.get("DATA_DIR", "/usr/share/datasets/fashion-mnist")


def load(train):
    prefix = "train" if train else "t10k"

    def idx(name):
        with gzip.open(os.path.join(DATA, f"{prefix}-{name}.gz"), "rb") as f:
            raw = f.read()
        dims = raw[3]
        shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big")
                 for i in range(dims)]
        return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)

    x = idx("images-idx3-ubyte").reshape(-1, 784).astype(np.float32) / 255
    return torch.from_numpy(x), torch.from_numpy(
        idx("labels-idx1-ubyte").astype(np.int64))


def main():
    # SIGTERM (the pod is stopped): leave through the `with` below, so that
    # the rank waits for a replacement instead of for missed heartbeats.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    torch.set_num_threads(1)
    steps = int(os.environ.get("STEPS", "300"))
    batch = int(os.environ.get("BATCH", "64"))
    with downpour.JobMember.join() as member, \
            downpour.Client.connect() as client:
        rank, total = member.rank, member.policy.total_workers
        x, y = load(train=True)
        x, y = x[rank::total], y[rank::total]  # this rank's shard
        torch.manual_seed(1)
        net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                  torch.nn.Linear(256, 10))
        model = dpt.DistributedModel(net, client, member,
                                     optimizer=dpt.SGD(lr=0.1), name="mlp")
        print(f"rank {rank} of {total}, {member.policy.kind}, starting at "
              f"clock {model.clock}", flush=True)
        g = torch.Generator().manual_seed(rank)
        order = torch.randperm(len(y), generator=g)
        loss = torch.tensor(float("nan"))
        for step in range(model.clock, steps):
            b = order[(step * batch) % len(y):][:batch]
            loss = F.cross_entropy(model(x[b]), y[b])
            loss.backward()
            model.step(loss.item(), examples=len(b))
        model.finish()
        if rank == 0:
            tx, ty = load(train=False)
            with torch.no_grad():
                accuracy = (net(tx).argmax(1) == ty).float().mean().item()
            print(f"clock {steps}: train loss {loss.item():.4f}, test "
                  f"accuracy {accuracy:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A BSP training worker as its own process, for resume_test.py and
run_test.py: it joins the job through the environment contract
(DOWNPOUR_SCHEDULER, DOWNPOUR_RANK, DOWNPOUR_NAME; downpour.env), trains a
small net with downpour.torch on batches that depend only on (rank, step),
and writes its final parameters to --out (.npz).

--pause_after=K: after step K - 1 (clock K reported and flushed) print
"paused at clock K" and wait to be killed, so that a test can kill it
between two steps. A replacement of a lost rank retries joining while the
scheduler still holds the rank for the old process (AlreadyExistsError),
as a restarted pod would.
"""

import argparse
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import downpour
import downpour.torch as dpt


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(20, 32)
        self.fc2 = torch.nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def join(deadline_s):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return downpour.JobMember.join()
        except downpour.AlreadyExistsError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--pause_after", type=int, default=-1)
    ap.add_argument("--out", default="",
                    help="where to write the final parameters; {rank} is "
                    "replaced by the rank")
    ap.add_argument("--fail_rank", type=int, default=-1,
                    help="this rank exits 3 after joining (run_test)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    member = join(120)
    if member.rank == args.fail_rank:
        print(f"rank {member.rank}: failing on purpose", flush=True)
        return 3
    client = downpour.Client.connect(op_timeout=120)
    torch.manual_seed(7)
    net = Net()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 20, generator=g)
    y = (x @ torch.randn(20, 3, generator=g)).argmax(1)
    workers = member.policy.num_workers
    # part_bytes small: fc1.weight goes out in several row ranges.
    model = dpt.DistributedModel(net, client, member,
                                 optimizer=dpt.SGD(lr=0.1), name="resume",
                                 part_bytes=1024)
    print(f"rank {member.rank} of {workers} starts at clock {model.clock} "
          f"resumed={model.resumed}", flush=True)
    for step in range(model.clock, args.steps):
        b = (step * workers + member.rank) * 16 % len(y)
        F.cross_entropy(model(x[b:b + 16]), y[b:b + 16]).backward()
        model.step()
        if step + 1 == args.pause_after:
            member.flush(30)
            print(f"paused at clock {step + 1}", flush=True)
            while True:  # until the test kills this process
                time.sleep(60)
    model.finish()
    if args.out:
        np.savez(args.out.format(rank=member.rank), **{k: v.detach().numpy()
                              for k, v in net.state_dict().items()})
    member.leave(finished=True)
    client.close()
    print(f"rank {member.rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

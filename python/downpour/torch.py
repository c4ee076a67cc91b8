"""PyTorch integration: a ``torch.nn.Module`` whose parameters live in
Downpour tables, trained under the job's consistency policy (BSP, SSP or
ASP) by any number of worker processes::

    import downpour, downpour.torch

    member = downpour.JobMember.join(scheduler, name=f"worker-{i}")
    client = downpour.Client.connect(scheduler)
    model = downpour.torch.DistributedModel(
        net, client, member, optimizer=downpour.torch.SGD(lr=0.2))
    for x, y in batches:                 # this worker's shard
        loss = F.cross_entropy(model(x), y)   # pulls fresh values first
        loss.backward()                  # each gradient leaves when ready
        model.step(loss.item())          # waits for the servers, clock + 1
    model.finish()

What happens, per step c (see docs/ARCHITECTURE.md, "Python and PyTorch"):

- Before the forward pass (a forward pre-hook on the module) the parameters
  hold the values step c must start from: under SSP after ``WaitClock(c)``
  and a pull; under BSP from the replies of step c - 1 (no pull, no wait);
  under ASP from the last reply.
- During ``backward()`` a hook on every parameter fires as soon as autograd
  has produced that parameter's gradient (the last layer first) and sends
  it at once, without waiting for the rest: under BSP and ASP as a
  ``push_pull`` whose reply carries the updated values (BSP: once all N
  workers' gradients of step c are averaged and applied), under SSP as a
  ``push``. Large parameters go out in row ranges of about ``part_bytes``.
- ``step()`` waits for the acknowledgements (GIL released), puts the
  replies into the parameters, and reports clock c + 1 to the scheduler
  (asynchronously). Under ASP with ``pipeline=True`` (the default) it does
  not wait for step c's reply but for step c - 1's: the next forward pass
  computes on values one step staler while step c is on the wire, which ASP
  allows.

The update rule runs on the servers: ``optimizer`` picks it (``SGD``,
``Adagrad``, ``Momentum``, ``Adam``). There is no local optimizer step;
``step()`` clears ``.grad`` (as ``zero_grad(set_to_none=True)`` would).

A worker that replaces a lost one (same rank, e.g. the restarted pod of an
Indexed Job) or joins a job restored from a checkpoint resumes: its
``JobMember`` says where (``start_clock``), and the model starts at that
clock (``model.clock``), writes no initial values over the trained tables
and waits at no start-up barrier. The loop must start there too, on the
batch that step would have had::

    for step in range(model.clock, steps):   # 0 unless resumed
        x, y = batch(rank, step)

Under BSP the job then ends bit for bit where an undisturbed run would,
provided the lost worker died between two steps.

Rules: one ``backward()`` per ``step()`` (a second raises RuntimeError:
the servers count one gradient per worker and step); parameters that got
no gradient in a step are sent zeros, so a BSP step still completes.
Buffers (e.g. BatchNorm statistics) are not shared; only parameters with
``requires_grad`` are. Parameters on a GPU are staged through CPU buffers.

Not thread-safe: one training loop per DistributedModel.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, List, Mapping, Optional

import numpy as np
import torch

import downpour


@dataclasses.dataclass(frozen=True)
class ServerOptimizer:
    """The update rule the servers apply to pushed gradients.

    handler / handler_params: a table handler (Client.create_table).
    grad_scale: if set, the worker multiplies step c's gradients by
    grad_scale(c) before sending them (a learning-rate schedule for handlers
    whose rate is fixed on the servers, as SGD's is set to 1 here).
    """

    handler: str
    handler_params: Mapping[str, float]
    grad_scale: Optional[Callable[[int], float]] = None


def SGD(lr: float, warmup_steps: int = 0,
        warmup_from: Optional[float] = None) -> ServerOptimizer:
    """Plain SGD: ``w -= lr(c) * g``. With warmup_steps, the rate ramps
    linearly from warmup_from (default lr / 10) at step 0 to lr at step
    warmup_steps - 1, then stays. Under BSP g is the mean of the N workers'
    gradients, exactly as DistributedDataParallel averages them."""
    if lr <= 0:
        raise ValueError(f"lr must be positive, got {lr}")
    start = lr / 10 if warmup_from is None else warmup_from

    def rate(clock: int) -> float:
        if warmup_steps <= 0:
            return lr
        ramp = min(1.0, (clock + 1) / warmup_steps)
        return start + (lr - start) * ramp

    # The servers run SGD at rate 1 and the worker scales its gradients, so
    # the schedule needs no server round trip.
    return ServerOptimizer("sgd", {"learning_rate": 1.0}, rate)


def Adagrad(lr: float, initial_accumulator: float = 0.1,
            epsilon: float = 1e-8) -> ServerOptimizer:
    """Adagrad on the servers (per-coordinate rates; stable when many
    asynchronous workers push, which is why SSP and ASP jobs use it)."""
    return ServerOptimizer("adagrad", {"learning_rate": lr,
                                       "initial_accumulator":
                                           initial_accumulator,
                                       "epsilon": epsilon})


def Momentum(lr: float, momentum: float = 0.9) -> ServerOptimizer:
    return ServerOptimizer("momentum", {"learning_rate": lr,
                                        "momentum": momentum})


def Adam(lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
         epsilon: float = 1e-8) -> ServerOptimizer:
    return ServerOptimizer("adam", {"learning_rate": lr, "beta1": beta1,
                                    "beta2": beta2, "epsilon": epsilon})


class _Param:
    """One parameter, its table, its send buffer and its reply buffers."""

    def __init__(self, name: str, param: torch.nn.Parameter,
                 table: downpour.Table, part_rows: int, replies: int):
        self.name = name
        self.param = param
        self.table = table
        self.rows = table.num_keys
        self.width = table.width
        numel = param.numel()
        # Reused every step: fresh pages are slow to write on some VMs, and
        # these are the arrays the SDK sends from and receives into without
        # copying.
        self.grad = torch.zeros(numel, dtype=torch.float32)
        self.grad_np = self.grad.numpy()
        self.reply = [torch.zeros(numel, dtype=torch.float32)
                      for _ in range(replies)]
        self.reply_np = [r.numpy() for r in self.reply]
        # Row ranges [b, e) sent as one operation each; the same cut on
        # every worker (BSP aggregates per range and clock).
        self.parts = [(b, min(self.rows, b + part_rows))
                      for b in range(0, self.rows, part_rows)]
        self.sent_clock = -1
        # Pulled straight into the parameter when its storage allows.
        p = param.detach()
        self.direct = (p.device.type == "cpu" and p.dtype == torch.float32
                       and p.is_contiguous())

    def load(self, values: torch.Tensor) -> None:
        """Copies flat float32 values into the parameter (any device or
        dtype)."""
        with torch.no_grad():
            self.param.copy_(values.view_as(self.param))


def _table_shape(param: torch.nn.Parameter) -> tuple:
    """(rows, width): one key per row of the first dimension."""
    if param.dim() == 0:
        return 1, 1
    rows = param.shape[0]
    return rows, param.numel() // rows if rows else 1


class DistributedModel(torch.nn.Module):
    """Wraps ``module`` so that its parameters live in Downpour tables and
    every worker of the job trains the same model (see the module
    docstring). Calling it calls ``module``.

    client: a connected downpour.Client. member: this process's
    downpour.JobMember (rank and policy). optimizer: the servers' update
    rule (default SGD(lr=0.01)). name: prefix of the table names
    ("<name>/<parameter name>"); every worker must use the same module
    structure and name. part_bytes: large parameters are sent in row ranges
    of about this size, so that servers apply the first while the rest is
    on the wire. pipeline: ASP only, compute step c + 1 while step c's
    exchange is in flight (default True). timeout: seconds for the
    scheduler waits (WaitClock, the initial barrier).

    The constructor declares the tables (identical declarations are shared),
    rank 0 writes its initial values, and every worker waits for that at a
    barrier and pulls them, so all start from rank 0's initialization;
    unless the member resumes (``resumed``: a replacement of a lost worker,
    a job restored from a checkpoint), which starts at
    ``member.start_clock`` on the tables' trained values.
    Raises downpour.errors exceptions (e.g. AlreadyExistsError if a table
    of that name exists with another shape).
    """

    def __init__(self, module: torch.nn.Module, client: downpour.Client,
                 member, *, optimizer: Optional[ServerOptimizer] = None,
                 name: str = "model", part_bytes: int = 256 << 10,
                 pipeline: bool = True, timeout: float = 120.0):
        super().__init__()
        self.module = module
        self.client = client
        self.member = member
        self.optimizer = optimizer or SGD(lr=0.01)
        self.policy = member.policy
        self.rank = member.rank
        self.timeout = timeout
        self._bsp = self.policy.is_bsp
        self._asp = self.policy.is_asp
        self._pipelined = self._asp and pipeline
        self._clock = 0
        self._examples = 0
        self._need_pull = True    # params must be pulled before a forward
        self._fresh = False       # params hold the values of this clock
        self._finished = False
        self._ops: Dict[int, List[downpour.Operation]] = {}
        self._discarded = client.discarded_pushes
        self._wait_seconds = 0.0  # in step(), for stats()
        self._pull_seconds = 0.0
        self._params: List[_Param] = []
        self._hooks = []

        named = [(n, p) for n, p in module.named_parameters()
                 if p.requires_grad]
        if not named:
            raise ValueError("the module has no parameters that require "
                             "gradients")
        for pname, param in named:
            rows, width = _table_shape(param)
            table = client.create_table(
                f"{name}/{pname}", num_keys=rows, width=width,
                handler=self.optimizer.handler,
                handler_params=dict(self.optimizer.handler_params),
                follows_job=True)
            part_rows = max(1, part_bytes // (4 * width))
            self._params.append(_Param(pname, param, table, part_rows,
                                       replies=2 if self._pipelined else 1))
        # Embedding layers (downpour/embedding.py) inside the module take
        # part in the steps: their pushes carry this model's clock and are
        # landed before a clock is reported.
        self._sparse = [m for m in module.modules()
                        if hasattr(m, "_downpour_step_end")]
        for m in self._sparse:
            m._downpour_attach(self)
        init_barrier = f"downpour.torch/{name}/init"
        # The tables hold trained values when the job was restored or this
        # member replaces a lost one (even one lost before its first clock
        # report: the job had passed the barrier): nobody overwrites them
        # with initial values, and the others are long past the barrier.
        self.resumed = (member.start_clock > 0 or member.restored_from != 0
                        or member.barrier_passed(init_barrier))
        self._clock = self._first_clock = member.start_clock
        if not self.resumed:
            if self.rank == 0:
                for p in self._params:
                    flat = p.param.detach().to("cpu",
                                               torch.float32).reshape(-1)
                    client.put(p.table, None, flat.contiguous().numpy())
            member.barrier(init_barrier, timeout)
        for i, p in enumerate(self._params):
            self._hooks.append(p.param.register_hook(self._grad_hook(i)))
        self._hooks.append(module.register_forward_pre_hook(
            lambda _module, _inputs: self.refresh()))

    # -- the training loop's calls -------------------------------------------

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @property
    def clock(self) -> int:
        """The step being computed: steps below it are complete."""
        return self._clock

    def refresh(self) -> None:
        """Makes the module hold the values step ``clock`` starts from (what
        the next forward pass sees): waits for the policy's gate and pulls
        if needed. Runs before every forward pass (a forward pre-hook); call
        it to read the parameters between steps (e.g. to evaluate or save
        them)."""
        self._check_open()
        if self._fresh:
            return
        if self._need_pull:
            c = self._clock
            gating = self.member.wait_clock(c, self.timeout)
            if gating > c and self.policy.backup_workers > 0:
                self._clock = c = gating  # a straggler skips ahead
            self.pull()
            self._need_pull = False
        self.client.set_worker_clock(self.rank, self._clock)
        self._fresh = True

    def step(self, loss: float = 0.0, examples: int = 0,
             test_accuracy: float = -1.0) -> None:
        """Completes step ``clock``: sends what backward did not (zeros for
        parameters without a gradient), waits for the servers, updates the
        parameters and reports the clock (with loss, examples in this step
        and, if evaluated, the test accuracy) to the scheduler."""
        self._check_open()
        c = self._clock
        for i, p in enumerate(self._params):
            if p.sent_clock != c:
                p.grad.zero_()
                self._send(i)
        for m in self._sparse:
            m._downpour_step_end(c)
        self._examples += examples
        start = time.perf_counter()
        if self._pipelined:
            # Step c - 1's exchange is the one to land; step c's stays in
            # flight while the next step computes on c - 1's values.
            if c > self._first_clock:
                self._land(c - 1)
                for p in self._params:
                    p.load(p.reply[(c - 1) % 2])
                self._report(c, loss, test_accuracy)
            self._need_pull = False
        else:
            self._land(c)
            late = self.client.discarded_pushes != self._discarded
            self._discarded = self.client.discarded_pushes
            # SSP pulls after WaitClock; a BSP worker whose push came late
            # (a backup) was not answered with the step's values.
            self._need_pull = not (self._bsp or self._asp) or late
            if not self._need_pull:
                for p in self._params:
                    p.load(p.reply[0])
            self._report(c + 1, loss, test_accuracy)
        self._wait_seconds += time.perf_counter() - start
        for p in self._params:
            p.param.grad = None
        self._clock = c + 1
        self._fresh = False

    def finish(self, timeout: float = 60.0) -> None:
        """Lands what is still in flight, reports the last clock, waits until
        the scheduler has every report, and removes the hooks: the module
        keeps the final values and runs on them, unsynchronized (step()
        then raises RuntimeError)."""
        if self._finished:
            return
        for m in self._sparse:
            m._downpour_finish()
        if self._pipelined and self._clock > self._first_clock:
            c = self._clock - 1
            self._land(c)
            for p in self._params:
                p.load(p.reply[c % 2])
            self._report(self._clock, 0.0, -1.0)
        self.member.flush(timeout)
        for h in self._hooks:
            h.remove()
        self._finished = True

    def pull(self) -> None:
        """Pulls the current values from the servers into the module now
        (e.g. rank 0 before a final evaluation under ASP)."""
        start = time.perf_counter()
        self.client.set_worker_clock(self.rank, self._clock)
        ops = []
        for p in self._params:
            out = (p.param.detach().view(-1).numpy() if p.direct
                   else p.reply_np[0])
            ops.append(self.client.pull(p.table, None, out, async_op=True))
        for op in ops:
            op.wait()
        for p in self._params:
            if not p.direct:
                p.load(p.reply[0])
        self._pull_seconds += time.perf_counter() - start

    def stats(self) -> Dict[str, float]:
        """Where time went: seconds waiting in step() and pulling."""
        return {"step_wait_seconds": self._wait_seconds,
                "pull_seconds": self._pull_seconds,
                "max_staleness": float(self.client.max_staleness),
                "discarded_pushes": float(self.client.discarded_pushes)}

    def __enter__(self) -> "DistributedModel":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()

    # -- internals -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("DistributedModel.finish() was called")

    def _grad_hook(self, i: int):
        def hook(grad: torch.Tensor) -> None:
            p = self._params[i]
            if p.sent_clock == self._clock:
                raise RuntimeError(
                    f"a second gradient of '{p.name}' in step {self._clock}: "
                    "call step() after each backward() (the servers take "
                    "one gradient per worker and step)")
            scale = (self.optimizer.grad_scale(self._clock)
                     if self.optimizer.grad_scale else None)
            with torch.no_grad():
                g = grad.detach().reshape(-1)
                if scale is None:
                    p.grad.copy_(g)
                else:
                    torch.mul(g.to(torch.float32), scale, out=p.grad)
            self._send(i)
        return hook

    def _send(self, i: int) -> None:
        """Sends parameter i's gradient buffer for the current clock."""
        p = self._params[i]
        c = self._clock
        ops = self._ops.setdefault(c, [])
        reply = p.reply_np[c % 2 if self._pipelined else 0]
        w = p.width
        for b, e in p.parts:
            grads = p.grad_np[b * w:e * w]
            if self._bsp or self._asp:
                ops.append(self.client.push_pull(
                    p.table, range(b, e), grads, reply[b * w:e * w],
                    async_op=True))
            else:
                ops.append(self.client.push(p.table, range(b, e), grads,
                                            async_op=True))
        p.sent_clock = c

    def _land(self, clock: int) -> None:
        """Waits for step ``clock``'s operations; raises the first error."""
        ops = self._ops.pop(clock, [])
        error = None
        for op in ops:
            try:
                op.wait()
            except downpour.DownpourError as e:
                error = error or e
        if error is not None:
            raise error

    def _report(self, clock: int, loss: float, test_accuracy: float) -> None:
        self.member.report_clock(
            clock, loss=float(loss), examples=self._examples,
            test_accuracy=float(test_accuracy),
            max_staleness=self.client.max_staleness,
            discarded=self.client.discarded_pushes)


# The embedding layers and their optimizers live in downpour/embedding.py;
class EpochSampler(torch.utils.data.Sampler):
    """This worker's indices of each epoch, for a ``DataLoader``, in a job
    whose workers join and leave (``ps_scheduler --elastic_workers``)::

        sampler = downpour.torch.EpochSampler(member, len(dataset), seed=7)
        loader = torch.utils.data.DataLoader(dataset, batch_size=64,
                                             sampler=sampler)
        for epoch in range(first_epoch, epochs):
            sampler.set_epoch(epoch)     # asks the scheduler (once)
            for x, y in loader: ...

    Like ``torch.utils.data.DistributedSampler``, but the workers an epoch
    is split over come from the scheduler (``JobMember.epoch_share``): the
    workers in the job when any of them first asked for that epoch. Every
    worker permutes ``range(num_examples)`` alike (from ``seed`` and the
    epoch) and takes every ``count``-th index from its ``index``, so that
    within an epoch no example is skipped or trained twice while workers
    join and leave. A worker that joined during an epoch gets no indices of
    it (``len(sampler) == 0``). Leave for good between epochs: a split that
    names a worker counts on it.
    """

    def __init__(self, member: "downpour.JobMember", num_examples: int,
                 shuffle: bool = True, seed: int = 0,
                 timeout: float = 30.0):
        if num_examples < 0:
            raise ValueError("num_examples must be >= 0")
        self._member = member
        self._n = int(num_examples)
        self._shuffle = shuffle
        self._seed = int(seed)
        self._timeout = timeout
        self._epoch: Optional[int] = None
        self._indices: List[int] = []

    def set_epoch(self, epoch: int) -> None:
        """Fixes this worker's share of `epoch` (the scheduler's answer)."""
        share = self._member.epoch_share(epoch, timeout=self._timeout)
        if share is None:
            self._indices = []
        else:
            index, count = share
            if self._shuffle:
                g = torch.Generator()
                g.manual_seed(self._seed * 1_000_003 + epoch)
                order = torch.randperm(self._n, generator=g).tolist()
            else:
                order = list(range(self._n))
            self._indices = order[index::count]
        self._epoch = epoch

    @property
    def epoch(self) -> Optional[int]:
        return self._epoch

    def _check(self) -> None:
        if self._epoch is None:
            raise RuntimeError("EpochSampler: call set_epoch(epoch) first")

    def __iter__(self):
        self._check()
        return iter(list(self._indices))

    def __len__(self) -> int:
        self._check()
        return len(self._indices)


# downpour.torch.Embedding and the others are the same objects.
_EMBEDDING_NAMES = ("Embedding", "EmbeddingBag", "FieldEmbedding",
                    "RowwiseAdagrad", "Ftrl", "feature_keys",
                    "prefetch_loader")


def __getattr__(name: str):
    if name in _EMBEDDING_NAMES:
        from downpour import embedding
        return getattr(embedding, name)
    raise AttributeError(f"module 'downpour.torch' has no attribute {name!r}")

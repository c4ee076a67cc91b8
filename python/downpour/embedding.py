"""Embedding tables on the Downpour servers, for PyTorch models:
``Embedding`` and ``EmbeddingBag`` (the call signatures and semantics of
``torch.nn.Embedding`` / ``torch.nn.EmbeddingBag``) and ``FieldEmbedding``
(one table for many categorical fields, as a click model's 26), each
backed by one sparse table whose rows live on the servers, never in the
worker::

    import downpour, downpour.torch as dpt

    emb = dpt.EmbeddingBag(None, 16, mode="sum", client=client,
                           name="ads/emb", optimizer=dpt.RowwiseAdagrad(0.05))
    out = emb(ids, offsets)          # pulls the batch's distinct ids
    loss(out).backward()             # pushes one gradient row per id

Ids are any 64-bit integers (``num_embeddings=None``) or, as in torch,
indices below ``num_embeddings`` (IndexError otherwise). They become table
keys through ``feature_keys(ids, feature)`` (clicklog/feature_key.h):
SplitMix64(id ^ salt(feature)), a bijection of the id per feature that
spreads ids over the whole key space, so that the servers' contiguous key
ranges share the hot ids. Hash raw ids (strings, large hashes) into int64
first; distinct int64 ids of one feature never share a row.

A forward pass (training, grad enabled):

1. the batch's keys are de-duplicated (``torch.unique``); each distinct key
   is pulled once, straight into the float32 tensor the layer then uses as
   its local weight (U rows x dim; the pull writes into the tensor's own
   memory);
2. the output is ``F.embedding`` / ``F.embedding_bag`` of the batch's local
   indices over that weight: the same kernel torch runs over its full
   table, so outputs and gradients are the same (bit for bit for ``sum``);
3. in backward, a hook on the local weight receives one summed gradient row
   per distinct key and pushes them in one operation (asynchronously); the
   table's update rule (``optimizer``: ``Adagrad``, ``RowwiseAdagrad``,
   ``Adam``, ``Ftrl``, ``SGD``) applies it on the servers.

Without gradients (``eval()`` or ``torch.no_grad()``) it only pulls.

Steps and consistency. Inside a module that a ``downpour.torch.
DistributedModel`` wraps, the layers take part in its steps: their pushes
carry the worker's rank and clock, and ``model.step()`` waits for their
acknowledgements before it reports the clock, so the job's policy holds
for the embedding tables as for the dense ones (BSP: the servers average
the N workers' gradients of each key per clock and apply them once; a
worker whose batch did not touch the table still sends an empty push; at
most one training forward per layer and step). ``bsp_reduce="sum"``
makes that the sum instead of the mean (each worker scales its pushes by
N, the workers that count): TorchRec's convention, where an embedding row
takes the sum of the ranks' gradients while the dense parameters take
their mean, so a row touched by one worker in a step gets that worker's
whole gradient, as one process on that batch would, where the mean gives
it 1/N of it. It is refused in a job with
elastic seats, whose N changes at announced steps. ``consistency="asp"``
(or ``"ssp:N"``, ``"bsp"``) declares the table with its own policy, e.g.
the hybrid of dense BSP and asynchronous embeddings. Outside a job (no
DistributedModel) pushes carry no clock and a forward first waits for the
previous push, so it reads its own writes.

Bounded memory. ``bounds=dict(max_rows=..., eviction="lru", ...)`` declares
the table with a row cap and the other bounds of ``Client.create_table``
(max_rows, max_bytes, eviction, ttl_clocks, ttl_seconds, admit_after,
max_pending_ids, cold_tier): the servers keep at most the cap in memory,
evicting (or refusing writes), expiring, admitting ids by frequency, or
moving rows to a cold tier. A row that left memory without a cold tier
reads as its initial values again.

Prefetch. ``layer.prefetch(next_input)`` pulls the next batch's rows while
this step computes (``prefetch_loader`` does it around any iterable of
batches). The values then miss the updates of the step in progress:
at most one step of staleness, measured per lookup as the number of this
worker's steps whose pushes were not yet acknowledged when the pull left
(``stats()["max_lag"]``: 0 without prefetch, 1 with it). Under BSP the
prefetched values are exactly the state after step c - 1 for step c + 1
(the pull leaves before this worker's push of step c, without which step c
cannot be applied), so a BSP run with prefetch is still repeatable; under
SSP(s) the bound becomes s + 1.

Not thread-safe: one training loop per layer.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, \
    Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

import downpour
from downpour import _downpour
from downpour.torch import Adagrad, ServerOptimizer


def feature_keys(ids, feature: Union[int, Sequence[int]] = 0) -> np.ndarray:
    """Table keys (uint64 array of the ids' shape) of int64 ids (a tensor or
    array): SplitMix64(id ^ salt(feature)). `feature` is one feature number
    for all ids, or one per position of the last dimension."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    if not isinstance(feature, int):
        feature = list(feature)
    return _downpour.feature_keys(np.asarray(ids), feature)


def RowwiseAdagrad(lr: float, initial_accumulator: float = 0.0,
                   epsilon: float = 1e-8) -> ServerOptimizer:
    """Row-wise Adagrad on the servers (TorchRec / FBGEMM's, what DLRM
    uses): one accumulator per row, h += mean(g^2) over the row,
    w -= lr / (sqrt(h) + eps) * g. One float of state per row instead of
    one per element."""
    return ServerOptimizer("rowwise_adagrad", {
        "learning_rate": lr, "initial_accumulator": initial_accumulator,
        "epsilon": epsilon})


def Ftrl(alpha: float = 0.05, beta: float = 1.0, l1: float = 0.0,
         l2: float = 0.0) -> ServerOptimizer:
    """FTRL-proximal on the servers (per coordinate; l1 gives exact
    zeros)."""
    return ServerOptimizer("ftrl", {"alpha": alpha, "beta": beta, "l1": l1,
                                    "l2": l2})


def _parse_consistency(consistency: Optional[str]):
    """(kind, staleness) of "asp", "bsp", "ssp:N"; None for None."""
    if consistency is None:
        return None
    if consistency in ("asp", "bsp"):
        return consistency, 0
    if consistency.startswith("ssp:"):
        try:
            bound = int(consistency[4:])
        except ValueError:
            bound = -1
        if bound >= 0:
            return "ssp", bound
    raise ValueError(f"consistency must be 'asp', 'bsp' or 'ssp:N', got "
                     f"{consistency!r}")


_BOUNDS = ("max_rows", "max_bytes", "eviction", "ttl_clocks", "ttl_seconds",
           "admit_after", "max_pending_ids", "cold_tier")


def _check_bounds(bounds: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The table's memory bounds as create_table's keywords; a misspelt
    name is an error here rather than a table left unbounded."""
    if bounds is None:
        return {}
    unknown = sorted(set(bounds) - set(_BOUNDS))
    if unknown:
        raise ValueError(f"unknown bounds {unknown}; known: "
                         f"{', '.join(_BOUNDS)}")
    return dict(bounds)


class _Pulled:
    """One lookup's rows: the batch's ids, their distinct values and keys,
    the local index of each id, the pulled values and the pull in flight.

    The ids are de-duplicated as int64 values, sorted, so that the local
    indices keep the ids' order: torch's kernels then accumulate gradients
    in the same order as over a full table (bit for bit)."""

    __slots__ = ("ids", "unique", "keys", "inverse", "values", "op",
                 "landed_at_issue", "skip")

    def __init__(self, ids: np.ndarray, width: int,
                 to_keys: Optional[Callable[[np.ndarray], np.ndarray]]):
        self.ids = ids
        flat = torch.from_numpy(ids.reshape(-1))
        unique, inverse = torch.unique(flat, sorted=True, return_inverse=True)
        self.unique = unique.numpy()
        self.keys = (self.unique.view(np.uint64) if to_keys is None
                     else to_keys(self.unique))
        self.inverse = inverse.view(ids.shape)
        self.values = torch.empty(len(unique), width, dtype=torch.float32)
        self.op = None
        self.landed_at_issue = 0
        self.skip = None  # rows that take no gradient (padding)


class _SparseTable:
    """The engine the layers share: one sparse table, its pulls and pushes,
    the step bookkeeping. Not thread-safe."""

    def __init__(self, client: downpour.Client, name: str, width: int,
                 optimizer: Optional[ServerOptimizer], init: str,
                 init_a: float, init_b: float, init_seed: int,
                 follows_job: bool, consistency: Optional[str],
                 bounds: Optional[Dict[str, Any]], bsp_reduce: str):
        if bsp_reduce not in ("mean", "sum"):
            raise ValueError(f"bsp_reduce must be 'mean' or 'sum', got "
                             f"{bsp_reduce!r}")
        self.client = client
        self.width = width
        self.optimizer = optimizer or Adagrad(lr=0.05)
        self.consistency = _parse_consistency(consistency)
        self.bsp_reduce = bsp_reduce
        kwargs: Dict[str, Any] = dict(
            sparse=True, width=width, init=init, init_a=init_a,
            init_b=init_b, init_seed=init_seed,
            handler=self.optimizer.handler,
            handler_params=dict(self.optimizer.handler_params),
            follows_job=follows_job)
        if consistency is not None:
            kwargs["consistency"] = consistency
        kwargs.update(_check_bounds(bounds))
        self.table = client.create_table(name, **kwargs)
        self.follows_job = kwargs["follows_job"]
        self.model = None        # the DistributedModel taking part in
        self._local_clock = 0    # steps outside a job: pushes issued
        self._landed = 0         # steps whose pushes are acknowledged
        self._pushes: List[Tuple[int, downpour.Operation]] = []
        self._pushed_clock = -1
        self._prefetched: List[_Pulled] = []
        self.stats = {"lookups": 0, "pulls": 0, "pushes": 0,
                      "keys_looked_up": 0, "keys_pulled": 0,
                      "keys_pushed": 0, "prefetch_hits": 0,
                      "prefetch_misses": 0, "max_lag": 0,
                      "pull_wait_seconds": 0.0, "push_wait_seconds": 0.0}

    # -- the step protocol (DistributedModel calls these) ---------------------

    def attach(self, model) -> None:
        if self.model is not None and self.model is not model:
            raise RuntimeError("an embedding layer can take part in one "
                               "DistributedModel")
        if self.bsp_reduce == "sum" and model.policy.elastic_workers > 0:
            raise ValueError(
                f"table '{self.table.name}': bsp_reduce='sum' scales pushes "
                "by the job's N, which elastic seats change; use 'mean'")
        self.model = model
        self._landed = max(self._landed, model.clock)

    @property
    def clock(self) -> int:
        return self.model.clock if self.model is not None else \
            self._local_clock

    @property
    def synced(self) -> bool:
        """Whether the servers aggregate this table's pushes per clock
        (BSP): every step must then push exactly once. (Once tables carry
        their typed policy, ask it instead of the names.)"""
        if self.model is None or not self.follows_job:
            return False
        # The table's own policy (Table.consistency), else the job's.
        if self.table.consistency:
            return self.table.consistency == "bsp"
        return self.model.policy.is_bsp

    def _set_clock(self, clock: int) -> None:
        if self.model is not None:
            self.client.set_worker_clock(self.model.rank, clock)

    def step_end(self, clock: int) -> None:
        """Step `clock` is complete: a BSP table that got no push this step
        gets an empty one; every push of the step is landed."""
        if self.synced and self._pushed_clock != clock:
            self._set_clock(clock)
            empty_keys = np.zeros(0, np.uint64)
            self._pushes.append((clock, self.client.push(
                self.table, empty_keys, np.zeros(0, np.float32),
                async_op=True)))
            self._pushed_clock = clock
        self.land()

    def land(self) -> None:
        """Waits for every push in flight; raises the first error."""
        if not self._pushes:
            return
        start = time.perf_counter()
        error = None
        for clock, op in self._pushes:
            try:
                op.wait()
                self._landed = max(self._landed, clock + 1)
            except downpour.DownpourError as e:
                error = error or e
        self._pushes = []
        self.stats["push_wait_seconds"] += time.perf_counter() - start
        if error is not None:
            raise error

    # -- lookups ------------------------------------------------------------------

    def prefetch(self, ids: np.ndarray, to_keys=None) -> None:
        """Pulls the rows of a later lookup of exactly `ids` now. At most two
        prefetches are kept (the next step's and the one after)."""
        if self.model is None:
            self.land()  # outside a job: the pull sees our last push
        pulled = _Pulled(ids, self.width, to_keys)
        self._issue_pull(pulled, self.clock + 1)
        self._prefetched.append(pulled)
        if len(self._prefetched) > 2:
            self._prefetched.pop(0).op.wait()

    def lookup(self, ids: np.ndarray, train: bool, to_keys=None,
               padding: Optional[int] = None
               ) -> Tuple[torch.Tensor, torch.Tensor, Optional[int]]:
        """(weight [U, width], inverse of ids' shape, padding row): the rows
        of the distinct int64 ids, keyed by to_keys(distinct ids) (None: the
        ids are the keys' bits), as a leaf that pushes its gradient when
        `train`; the row of id `padding` (None if absent) reads as zeros and
        takes no gradient."""
        if self.model is None:
            self.land()  # outside a job: read our own writes
        pulled = None
        for i, p in enumerate(self._prefetched):
            if p.ids.shape == ids.shape and np.array_equal(p.ids, ids):
                pulled = p
                del self._prefetched[:i + 1]  # older ones will not be used
                self.stats["prefetch_hits"] += 1
                break
        if pulled is None:
            if self._prefetched:
                self.stats["prefetch_misses"] += 1
            pulled = _Pulled(ids, self.width, to_keys)
            self._issue_pull(pulled, self.clock)
        start = time.perf_counter()
        pulled.op.wait()
        self.stats["pull_wait_seconds"] += time.perf_counter() - start
        pulled.op = None
        self.stats["lookups"] += 1
        self.stats["keys_looked_up"] += ids.size
        self.stats["max_lag"] = max(self.stats["max_lag"],
                                    self.clock - pulled.landed_at_issue)
        weight = pulled.values
        pad = None
        if padding is not None:
            where = np.nonzero(pulled.unique == padding)[0]
            if len(where):
                pad = int(where[0])
                weight[pad].zero_()
                pulled.skip = np.zeros(len(pulled.keys), bool)
                pulled.skip[pad] = True
        if train:
            weight.requires_grad_(True)
            weight.register_hook(self._push_hook(pulled))
        return weight, pulled.inverse, pad

    def _issue_pull(self, pulled: _Pulled, clock: int) -> None:
        if (self.model is not None and self.follows_job
                and self.table.consistency.startswith("ssp:")):
            # An SSP table of its own (the hybrid in an ASP or SSP job): its
            # bound gates the read, whatever the job's (the scheduler
            # applies the table's policy: JobMember.wait_clock(table=)).
            self.model.member.wait_clock(clock, table=self.table)
        self._set_clock(clock)
        pulled.op = self.client.pull(self.table, pulled.keys,
                                     pulled.values.numpy(), async_op=True)
        self._set_clock(self.clock)
        pulled.landed_at_issue = self._landed
        self.stats["pulls"] += 1
        self.stats["keys_pulled"] += len(pulled.keys)

    def _push_hook(self, pulled: _Pulled) -> Callable:
        def hook(grad: torch.Tensor) -> None:
            clock = self.clock
            if self.synced and self._pushed_clock == clock:
                raise RuntimeError(
                    f"a second gradient of table '{self.table.name}' in step "
                    f"{clock}: under BSP each layer takes one training "
                    "forward per step (the servers count one push per "
                    "worker and step)")
            g = grad.detach().to(torch.float32)
            if self.optimizer.grad_scale is not None:
                g = g * self.optimizer.grad_scale(clock)
            if self.synced and self.bsp_reduce == "sum":
                # The servers divide the step's sum by N (as many as push).
                g = g * float(self.model.policy.num_workers)
            g = g.contiguous()
            keys = pulled.keys
            if pulled.skip is not None:  # padding rows take no gradient
                keep = ~pulled.skip
                keys = keys[keep]
                g = g[torch.from_numpy(keep)].contiguous()
            self._set_clock(clock)
            self._pushes.append((clock, self.client.push(
                self.table, keys, g.numpy(), async_op=True)))
            self._pushed_clock = clock
            self.stats["pushes"] += 1
            self.stats["keys_pushed"] += len(keys)
            if self.model is None:
                self._local_clock += 1
        return hook


def _ids_of(ids: torch.Tensor, num_embeddings: Optional[int]) -> np.ndarray:
    """The ids as an int64 array; IndexError outside [0, num_embeddings)."""
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"indices must be int64 or int32, got {ids.dtype}")
    ids_np = ids.detach().cpu().numpy().astype(np.int64, copy=False)
    if num_embeddings is not None and ids_np.size:
        if ids_np.min() < 0 or ids_np.max() >= num_embeddings:
            raise IndexError("index out of range in self")
    return ids_np


class _Layer(torch.nn.Module):
    """What the three layers share: the table and the step protocol."""

    def __init__(self, embedding_dim: int, client: downpour.Client, name: str,
                 optimizer: Optional[ServerOptimizer], init: str,
                 init_a: float, init_b: float, init_seed: int,
                 follows_job: bool, consistency: Optional[str],
                 bounds: Optional[Dict[str, Any]], bsp_reduce: str):
        super().__init__()
        if embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got "
                             f"{embedding_dim}")
        self.embedding_dim = embedding_dim
        self._table = _SparseTable(client, name, embedding_dim, optimizer,
                                   init, init_a, init_b, init_seed,
                                   follows_job, consistency, bounds,
                                   bsp_reduce)

    @property
    def table(self) -> downpour.Table:
        """The sparse table holding the rows."""
        return self._table.table

    def stats(self) -> Dict[str, float]:
        """Counters: lookups, pulls and pushes (operations), keys looked up
        (with repeats), pulled and pushed (distinct), prefetch hits and
        misses, max_lag (see the module docstring), seconds waiting for
        pulls and for push acknowledgements."""
        return dict(self._table.stats)

    def finish(self) -> None:
        """Waits for the pushes in flight (DistributedModel.finish() calls
        it)."""
        self._table.land()

    def rows(self, ids) -> torch.Tensor:
        """The current values of ids' rows, read without a clock (e.g. to
        check or export them): a float32 tensor of shape ids.shape + (dim,).
        """
        ids = torch.as_tensor(ids)
        keys = self._keys(ids)
        return self.rows_of_keys(keys.reshape(-1)).view(*ids.shape,
                                                        self.embedding_dim)

    def rows_of_keys(self, keys: np.ndarray) -> torch.Tensor:
        """The current values of the rows of table keys (a 1-D uint64 array,
        e.g. from feature_keys), [len(keys), dim], read without a clock."""
        out = torch.empty(len(keys), self.embedding_dim, dtype=torch.float32)
        self._table.client.get(self.table, np.ascontiguousarray(
            keys, dtype=np.uint64), out.numpy())
        return out

    # The hooks DistributedModel calls (downpour/torch.py).
    def _downpour_attach(self, model) -> None:
        self._table.attach(model)

    def _downpour_step_end(self, clock: int) -> None:
        self._table.step_end(clock)

    def _downpour_finish(self) -> None:
        self._table.land()

    def _train(self) -> bool:
        return self.training and torch.is_grad_enabled()

    def _keys(self, ids: torch.Tensor) -> np.ndarray:
        raise NotImplementedError


class _IdLayer(_Layer):
    """What Embedding and EmbeddingBag share: ids below num_embeddings (None:
    any 64-bit id), keyed with feature_keys(ids, feature); a padding_idx."""

    def __init__(self, num_embeddings: Optional[int], embedding_dim: int,
                 padding_idx: Optional[int], feature: int,
                 client: downpour.Client, name: str,
                 optimizer: Optional[ServerOptimizer], init: str,
                 init_a: float, init_b: float, init_seed: int,
                 follows_job: bool, consistency: Optional[str],
                 bounds: Optional[Dict[str, Any]], bsp_reduce: str):
        # Checked before the table is declared.
        if padding_idx is not None and num_embeddings is not None:
            if padding_idx < 0:
                padding_idx += num_embeddings
            if not 0 <= padding_idx < num_embeddings:
                raise ValueError("padding_idx must be within num_embeddings")
        super().__init__(embedding_dim, client, name, optimizer, init, init_a,
                         init_b, init_seed, follows_job, consistency,
                         bounds, bsp_reduce)
        self.num_embeddings = num_embeddings
        self.padding_idx = padding_idx
        self.feature = feature

    def _keys(self, ids: torch.Tensor) -> np.ndarray:
        return feature_keys(_ids_of(ids, self.num_embeddings), self.feature)

    def _to_keys(self, unique: np.ndarray) -> np.ndarray:
        return _downpour.feature_keys(unique, self.feature)

    def _lookup(self, input: torch.Tensor):
        return self._table.lookup(_ids_of(input, self.num_embeddings),
                                  self._train(), self._to_keys,
                                  self.padding_idx)

    def prefetch(self, input: torch.Tensor) -> None:
        """Starts pulling the rows of a later forward(input, ...) (see the
        module docstring)."""
        self._table.prefetch(_ids_of(input, self.num_embeddings),
                             self._to_keys)


class Embedding(_IdLayer):
    """``torch.nn.Embedding`` over a Downpour sparse table: forward(input)
    returns input.shape + (embedding_dim,), float32, on input's device (the
    lookup itself runs on the CPU). num_embeddings: None (any 64-bit id) or
    the bound indices must stay below. padding_idx: its row reads as zeros
    and takes no gradient; scale_grad_by_freq as in torch; max_norm and
    _weight are not supported; sparse is accepted and ignored (gradients
    always go to the servers). The rest is Downpour's: client, name (the
    table's; every worker uses the same), optimizer (the servers' rule,
    default Adagrad(0.05)), init / init_a / init_b / init_seed (the rows'
    initial values, a pure function of seed, key and column: torch's
    N(0, 1) by default), follows_job, consistency, bounds, bsp_reduce
    (module docstring)."""

    def __init__(self, num_embeddings: Optional[int], embedding_dim: int,
                 padding_idx: Optional[int] = None,
                 max_norm: Optional[float] = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool = False,
                 _weight: None = None, device=None, dtype=None, *,
                 client: downpour.Client, name: str,
                 optimizer: Optional[ServerOptimizer] = None,
                 init: str = "normal", init_a: float = 0.0,
                 init_b: float = 1.0, init_seed: int = 0,
                 follows_job: bool = True,
                 consistency: Optional[str] = None, feature: int = 0,
                 bounds: Optional[Dict[str, Any]] = None,
                 bsp_reduce: str = "mean"):
        _check_torch_args(max_norm, _weight, dtype)
        super().__init__(num_embeddings, embedding_dim, padding_idx, feature,
                         client, name, optimizer, init, init_a, init_b,
                         init_seed, follows_job, consistency, bounds,
                         bsp_reduce)
        self.scale_grad_by_freq = scale_grad_by_freq

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight, inverse, pad = self._lookup(input)
        return F.embedding(inverse, weight, pad, None, 2.0,
                           self.scale_grad_by_freq, False).to(input.device)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, "
                f"table='{self.table.name}'")


class EmbeddingBag(_IdLayer):
    """``torch.nn.EmbeddingBag`` over a Downpour sparse table:
    forward(input, offsets=None, per_sample_weights=None) with mode "sum",
    "mean" or "max", include_last_offset and padding_idx (entries excluded
    from their bag) as in torch. Other arguments as for Embedding."""

    def __init__(self, num_embeddings: Optional[int], embedding_dim: int,
                 max_norm: Optional[float] = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, mode: str = "mean",
                 sparse: bool = False, _weight: None = None,
                 include_last_offset: bool = False,
                 padding_idx: Optional[int] = None, device=None,
                 dtype=None, *, client: downpour.Client, name: str,
                 optimizer: Optional[ServerOptimizer] = None,
                 init: str = "normal", init_a: float = 0.0,
                 init_b: float = 1.0, init_seed: int = 0,
                 follows_job: bool = True,
                 consistency: Optional[str] = None, feature: int = 0,
                 bounds: Optional[Dict[str, Any]] = None,
                 bsp_reduce: str = "mean"):
        _check_torch_args(max_norm, _weight, dtype)
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode has to be one of sum, mean or max, got "
                             f"{mode!r}")
        super().__init__(num_embeddings, embedding_dim, padding_idx, feature,
                         client, name, optimizer, init, init_a, init_b,
                         init_seed, follows_job, consistency, bounds,
                         bsp_reduce)
        self.mode = mode
        self.scale_grad_by_freq = scale_grad_by_freq
        self.include_last_offset = include_last_offset

    def forward(self, input: torch.Tensor,
                offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        weight, inverse, pad = self._lookup(input)
        if offsets is not None:
            offsets = offsets.cpu()
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.cpu()
        return F.embedding_bag(inverse, weight, offsets, None, 2.0,
                               self.scale_grad_by_freq, self.mode, False,
                               per_sample_weights, self.include_last_offset,
                               pad).to(input.device)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, "
                f"mode={self.mode!r}, table='{self.table.name}'")


class FieldEmbedding(_Layer):
    """One table for several categorical fields, one id per field per
    example (a click log's 26): forward(ids [..., num_fields]) returns
    [..., num_fields, embedding_dim], field j's ids keyed with feature
    fields[j] (default j), so that equal ids of different fields are
    different rows. One pull and one push per step whatever the number of
    fields. cardinalities: optional per-field bounds (IndexError beyond).
    Other arguments as for Embedding."""

    def __init__(self, num_fields: int, embedding_dim: int, *,
                 client: downpour.Client, name: str,
                 optimizer: Optional[ServerOptimizer] = None,
                 init: str = "normal", init_a: float = 0.0,
                 init_b: float = 1.0, init_seed: int = 0,
                 follows_job: bool = True,
                 consistency: Optional[str] = None,
                 bounds: Optional[Dict[str, Any]] = None,
                 fields: Optional[Sequence[int]] = None,
                 cardinalities: Optional[Sequence[int]] = None,
                 bsp_reduce: str = "mean"):
        super().__init__(embedding_dim, client, name, optimizer, init, init_a,
                         init_b, init_seed, follows_job, consistency,
                         bounds, bsp_reduce)
        self.num_fields = num_fields
        self.fields = list(fields) if fields is not None else \
            list(range(num_fields))
        if len(self.fields) != num_fields:
            raise ValueError(f"{len(self.fields)} field numbers for "
                             f"{num_fields} fields")
        self.cardinalities = (np.asarray(cardinalities, np.int64)
                              if cardinalities is not None else None)

    def _keys(self, ids: torch.Tensor) -> np.ndarray:
        if ids.shape[-1:] != (self.num_fields,):
            raise ValueError(f"ids must end in a dimension of "
                             f"{self.num_fields} fields, got shape "
                             f"{tuple(ids.shape)}")
        ids_np = _ids_of(ids, None)
        if self.cardinalities is not None and ids_np.size and (
                (ids_np < 0).any() or (ids_np >= self.cardinalities).any()):
            raise IndexError("index out of range in self")
        return _downpour.feature_keys(ids_np, self.fields)

    def prefetch(self, input: torch.Tensor) -> None:
        """Starts pulling the rows of a later forward(input)."""
        self._table.prefetch(self._keys(input).view(np.int64))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # The fields' ids become keys first (equal ids of two fields are two
        # rows); the keys' bits are what is de-duplicated.
        weight, inverse, _ = self._table.lookup(
            self._keys(input).view(np.int64), self._train())
        return F.embedding(inverse, weight).to(input.device)

    def extra_repr(self) -> str:
        return (f"{self.num_fields} fields, {self.embedding_dim}, "
                f"table='{self.table.name}'")


def _check_torch_args(max_norm, _weight, dtype) -> None:
    """torch's arguments that a table on the servers cannot honour."""
    if max_norm is not None:
        raise NotImplementedError("max_norm is not supported (the rows live "
                                  "on the servers)")
    if _weight is not None:
        raise ValueError("_weight: the rows live on the servers (use init, "
                         "or put values into the table)")
    if dtype not in (None, torch.float32):
        raise ValueError(f"dtype: the tables hold float32, not {dtype}")


def prefetch_loader(batches: Iterable, prefetch: Callable[[Any], None]
                    ) -> Iterator:
    """Yields the items of `batches`, calling prefetch(next_item) before it
    yields each item, so that the next step's rows are pulled while this one
    computes::

        loader = dpt.prefetch_loader(data_loader,
                                     lambda b: emb.prefetch(b["ids"]))
        for b in loader:
            loss = model(b["dense"], b["ids"]) ...

    At most one step of staleness (module docstring)."""
    it = iter(batches)
    try:
        current = next(it)
    except StopIteration:
        return
    while True:
        try:
            upcoming = next(it)
        except StopIteration:
            yield current
            return
        prefetch(upcoming)
        yield current
        current = upcoming

"""How many bytes each rank sends, and in how many latency steps, for one collective.

The α–β (latency–bandwidth) model of a collective on ``n`` ranks is ``t = L·α + V·β``: ``L``
message start-ups on the critical path (``latency_steps``) and ``V`` bytes each rank sends on it
(``bus_bytes``), with ``S`` the size of the whole array the collective moves (``full_size``).
Costs per algorithm, from MPICH's implementations (Thakur, Rabenseifner & Gropp 2005,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1)), reduction
arithmetic (their γ term) folded into β:

=============== ============================== ===============================
collective      ring: L, V                     tree (binomial): L, V
=============== ============================== ===============================
all_reduce      2(n−1),  2·S·(n−1)/n           2⌈log2 n⌉, 2·S·⌈log2 n⌉
reduce_scatter  n−1,     S·(n−1)/n             ⌈log2 n⌉, S·(n−1)/n
all_gather      n−1,     S·(n−1)/n             ⌈log2 n⌉, S·(n−1)/n
broadcast       n−1,     S                     ⌈log2 n⌉, S·⌈log2 n⌉
reduce          n−1,     S                     ⌈log2 n⌉, S·⌈log2 n⌉
all_to_all      n−1,     S·(n−1)/n             n−1, S·(n−1)/n
=============== ============================== ===============================

The ring factors are NCCL's bus-bandwidth factors (nccl-tests ``doc/PERFORMANCE.md``: all-reduce
2(n−1)/n, reduce-scatter and all-gather (n−1)/n, broadcast and reduce 1, all-to-all (n−1)/n), so
``V/t`` of a ring collective is the bus bandwidth nccl-tests prints. The tree rows are the
binomial-tree costs of MPICH (reduce-scatter and all-gather by recursive halving/doubling, which
take ⌈log2 n⌉ steps for the same volume). On one rank nothing moves: ``L = V = 0``.

``S`` is the whole array (nccl-tests: "S is the size in bytes of the total array"). What a
marker or a record says is converted by ``full_size``: the PyTorch hooks record the rank's input
payload, which for an all-gather is one rank's shard (``S = bytes·n``) and for a reduce-scatter
the whole input (``S = bytes``); NCCL's Inspector records its ``count`` argument, which for both
is per rank (``S = bytes·n``).

Sharding strategies (``step_plan``) name the collectives of one training step for gradients of
``G`` bytes (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC20, §7 "Communication analysis of ZeRO-DP"): DDP all-reduces them (2Ψ per
rank); ZeRO-1 and ZeRO-2 reduce-scatter the gradients and all-gather the updated parameters
(Ψ + Ψ, the same volume as DDP); ZeRO-3 and FSDP (full shard) all-gather the parameters in the
forward and again in the backward and reduce-scatter the gradients (3Ψ, 1.5× DDP). Parameters
are taken to have the gradients' size and type.
"""
from __future__ import annotations

import math

COLLECTIVES: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
ALGORITHMS: tuple[str, ...] = ("ring", "tree")
PARALLELISMS: tuple[str, ...] = ("ddp", "zero1", "zero2", "zero3", "fsdp")

# Collective names as the PyTorch hooks (torch.distributed function names) and NCCL's Inspector
# write them, to the collective they are.
_NAMES: dict[str, str] = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "allreduce": "all_reduce",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter", "reducescatter": "reduce_scatter",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
    "all_gather_coalesced": "all_gather", "allgather": "all_gather",
    "broadcast": "broadcast", "_broadcast_coalesced": "broadcast",
    "reduce": "reduce",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all", "alltoall": "all_to_all",
}
# Sources whose all_gather and reduce_scatter bytes are per rank (``full_size``).
PER_RANK_COUNT_SOURCES: frozenset[str] = frozenset({"inspector"})


def canonical(name: str) -> str | None:
    """The collective a marker name or an Inspector name ("AllReduce") stands for, else None
    (barrier, gather, scatter and names of the job's own carry no known volume)."""
    return _NAMES.get(name.strip().lower().replace(" ", ""))


def _check(collective: str, n: int, algorithm: str) -> None:
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; use one of {', '.join(COLLECTIVES)}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    if n < 1:
        raise ValueError(f"a communicator has at least 1 rank, got {n}")


def full_size(collective: str, nbytes: float, n: int, source: str = "markers") -> float:
    """``S``, the whole array's bytes, from the ``nbytes`` a source recorded (module docstring)."""
    _check(collective, n, "ring")
    if collective == "all_gather" or (collective == "reduce_scatter" and source in PER_RANK_COUNT_SOURCES):
        return nbytes * n
    return nbytes


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def latency_steps(collective: str, n: int, algorithm: str = "ring") -> float:
    """``L``: message start-ups on the critical path of one collective on ``n`` ranks."""
    _check(collective, n, algorithm)
    if n == 1:
        return 0.0
    if algorithm == "tree" and collective != "all_to_all":
        return float(2 * _log2(n) if collective == "all_reduce" else _log2(n))
    return float(2 * (n - 1) if collective == "all_reduce" else n - 1)


def bus_bytes(collective: str, size: float, n: int, algorithm: str = "ring") -> float:
    """``V``: bytes each rank sends on the critical path of one collective of a ``size``-byte array."""
    _check(collective, n, algorithm)
    if n == 1:
        return 0.0
    share = (n - 1) / n
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return size * share
    if algorithm == "tree":
        return size * _log2(n) * (2 if collective == "all_reduce" else 1)
    return size * (2 * share if collective == "all_reduce" else 1.0)


def step_plan(parallelism: str, grad_bytes: float) -> list[tuple[str, float]]:
    """The collectives ``(collective, S)`` of one step of ``parallelism`` for ``grad_bytes`` of gradients."""
    if parallelism == "ddp":
        return [("all_reduce", grad_bytes)]
    if parallelism in ("zero1", "zero2"):
        return [("reduce_scatter", grad_bytes), ("all_gather", grad_bytes)]
    if parallelism in ("zero3", "fsdp"):
        return [("all_gather", grad_bytes), ("all_gather", grad_bytes), ("reduce_scatter", grad_bytes)]
    raise ValueError(f"unknown parallelism {parallelism!r}; use one of {', '.join(PARALLELISMS)}")


def gradient_bytes(plan: list[tuple[str, float]]) -> float:
    """The gradient bytes of a step from the collectives it ran: Σ S of its all-reduces and
    reduce-scatters (the inverse of ``step_plan`` for every strategy it knows)."""
    return sum(size for collective, size in plan if collective in ("all_reduce", "reduce_scatter"))

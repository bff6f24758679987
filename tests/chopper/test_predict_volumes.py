"""Collective volumes against their published factors (nccl-tests PERFORMANCE.md, MPICH's cost
comments after Thakur, Rabenseifner & Gropp 2005, ZeRO §7)."""
from __future__ import annotations

import pytest

from chopper.predict import volumes

# nccl-tests doc/PERFORMANCE.md "Summary": busbw = algbw × factor, i.e. bytes per rank = S × factor.
NCCL_BUSBW = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,
}


@pytest.mark.parametrize("collective", sorted(NCCL_BUSBW))
@pytest.mark.parametrize("n", [2, 3, 4, 8, 64, 1000])
def test_ring_bytes_are_nccls_bus_bandwidth_factors(collective: str, n: int) -> None:
    assert volumes.bus_bytes(collective, 1e9, n, "ring") == pytest.approx(1e9 * NCCL_BUSBW[collective](n), rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 5, 16])
def test_latency_steps_are_mpichs(n: int) -> None:
    # MPICH: ring allgather "(p-1).alpha", ring allreduce = reduce-scatter + allgather: 2(p-1);
    # binomial tree bcast / reduce "lgp.alpha"; tree allreduce = reduce + bcast: 2 lgp.
    lg = {2: 1, 4: 2, 5: 3, 16: 4}[n]
    assert volumes.latency_steps("all_gather", n, "ring") == n - 1
    assert volumes.latency_steps("all_reduce", n, "ring") == 2 * (n - 1)
    assert volumes.latency_steps("broadcast", n, "tree") == lg
    assert volumes.latency_steps("all_reduce", n, "tree") == 2 * lg
    # Binomial bcast and reduce: "n.lgp.beta" each.
    assert volumes.bus_bytes("broadcast", 10.0, n, "tree") == 10.0 * lg
    assert volumes.bus_bytes("all_reduce", 10.0, n, "tree") == 2 * 10.0 * lg


def test_one_rank_moves_nothing() -> None:
    for c in volumes.COLLECTIVES:
        assert volumes.bus_bytes(c, 1e6, 1) == volumes.latency_steps(c, 1) == 0.0


def test_full_size_from_what_each_source_records() -> None:
    # torch's all_gather_into_tensor input is one shard, its reduce_scatter_tensor input the whole array;
    # NCCL counts both per rank.
    assert volumes.full_size("all_gather", 100, 4) == 400
    assert volumes.full_size("reduce_scatter", 400, 4) == 400
    assert volumes.full_size("reduce_scatter", 100, 4, "inspector") == 400
    assert volumes.full_size("all_reduce", 100, 4, "inspector") == 100


def test_zero_stages_move_what_the_paper_says() -> None:
    # ZeRO §7: DDP 2Ψ per rank, P_os and P_os+g the same 2Ψ, P_os+g+p 3Ψ (1.5× DDP); FSDP full shard as ZeRO-3.
    psi, n = 1e9, 1024

    def volume(parallelism: str) -> float:
        return sum(volumes.bus_bytes(c, s, n) for c, s in volumes.step_plan(parallelism, psi))

    ddp = volume("ddp")
    assert ddp == pytest.approx(2 * psi * (n - 1) / n)
    assert volume("zero1") == volume("zero2") == pytest.approx(ddp)
    assert volume("zero3") == volume("fsdp") == pytest.approx(1.5 * ddp)
    for p in volumes.PARALLELISMS:
        assert volumes.gradient_bytes(volumes.step_plan(p, psi)) == psi


def test_names_of_hooks_and_inspector() -> None:
    assert volumes.canonical("all_gather_into_tensor") == volumes.canonical("AllGather") == "all_gather"
    assert volumes.canonical("ReduceScatter") == volumes.canonical("reduce_scatter_tensor") == "reduce_scatter"
    assert volumes.canonical("_broadcast_coalesced") == "broadcast"
    assert volumes.canonical("barrier") is None and volumes.canonical("grad_sync") is None


def test_bad_arguments_name_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown collective 'gossip'"):
        volumes.bus_bytes("gossip", 1, 2)
    with pytest.raises(ValueError, match="unknown algorithm 'star'"):
        volumes.latency_steps("all_reduce", 2, "star")
    with pytest.raises(ValueError, match="at least 1 rank"):
        volumes.bus_bytes("all_reduce", 1, 0)
    with pytest.raises(ValueError, match="unknown parallelism 'tp'"):
        volumes.step_plan("tp", 1)

"""``chopper.pytorch.instrument`` on real 2-rank gloo training (DDP, FSDP1 and FSDP2) against a real gRPC servicer.

Here the markers' structure is checked (steps, phases, collectives with their bytes, the backward
ending before DDP's and FSDP's synchronisation); exposed communication against the step time the
job itself loses to synchronisation is ``tests/e2e/test_exposed_truth.py``'s (DDP, rate-limited
links) and ``benchmarks/bench_exposed_truth.py``'s (DDP, FSDP2, HF Trainer): on loopback two ranks
and their gloo threads share two loaded cores, so that truth measures contention as much as
communication.
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import chopper
import chopper.pytorch as ctorch
from chopper.attribution.exposed_comm import exposed_seconds
from chopper.attribution.markers import paired_intervals
from chopper.demo.run import free_port
from tests.support import sync_truth_jobs
from tests.support.sync_truth_jobs import received

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH, STEPS = 256, 128, 4, 2, 32, 4, 4
PHASES = ("forward", "backward", "optimizer")


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    """A small decoder-only language model."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        # A fresh tensor, not the Linear's reshaped view: FSDP2 warns about view outputs.
        return self.head(x).clone()


def _worker(rank: int, kind: str, agent: str, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    chopper.init(job=kind, rank=rank, agent=agent, gpu=rank)
    model: nn.Module = Decoder()
    units = 0
    if kind == "ddp":
        # Small buckets: several all-reduces per step, issued while backward still runs.
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    elif kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        # One FSDP unit per Block plus the root, as fully_shard below; CPU ranks need device_id=cpu.
        model = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block}),
                                         device_id=torch.device("cpu"), use_orig_params=True)
        units = LAYERS + 1
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:  # type: ignore[union-attr]
            fully_shard(layer)
        fully_shard(model)
        units = LAYERS + 1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    originals = {n: getattr(dist, n) for n in ("all_reduce", "all_gather_single", "reduce_scatter_single")}
    inst = ctorch.instrument(model, opt, tokens_per_step=BATCH * SEQ)  # the one line under test
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        batch = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
        loss = loss_fn(model(batch[:, :-1]).reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    inst.remove()
    restored = all(getattr(dist, n) is f for n, f in originals.items())
    chopper.shutdown(timeout=5.0)
    Path(out, f"{rank}.json").write_text(json.dumps({
        "issued": dict(inst.collectives_issued), "marked": dict(inst.collectives_marked),
        "errors": dict(inst.errors), "flops_source": inst.flops_source, "flops": inst.flops_per_step,
        "steps": inst.steps, "units": units, "stats": chopper.stats(), "restored": restored,
    }))
    dist.destroy_process_group()


def run_job(kind: str) -> tuple[pd.DataFrame, dict[int, dict[str, Any]]]:
    """Train ``kind`` on 2 gloo ranks; the markers received (one row each) and each rank's report."""
    reports: dict[int, dict[str, Any]] = {}

    def train(target: str, workdir: str) -> None:
        mp.spawn(_worker, args=(kind, target, free_port(), workdir), nprocs=2, join=True)
        reports.update({r: json.loads(Path(workdir, f"{r}.json").read_text()) for r in range(2)})

    return received(kind, train), reports


def check_common(markers: pd.DataFrame, reports: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """Assertions both frameworks share; returns the paired intervals."""
    for rank, rep in reports.items():
        assert rep["errors"] == {}, rep
        assert rep["restored"]
        assert rep["steps"] == STEPS
        assert rep["stats"]["dropped"] == 0 and rep["stats"]["sent"] == rep["stats"]["queued"]
        # FLOPs counted on the first forward (FlopCounterMode ×3), carried on every STEP_END.
        assert rep["flops_source"] == "flop_counter" and rep["flops"] > 0
        mine = markers[markers["rank"] == rank]
        for k in ("step_begin", "step_end"):
            assert sorted(mine.loc[mine["kind"] == k, "step"]) == list(range(STEPS))
        ends = mine[mine["kind"] == "step_end"]
        assert (ends["flops"] == rep["flops"]).all() and (ends["tokens"] == BATCH * SEQ).all()
        check_phases(mine, split=rep["units"] > 0)
        # Every collective torch.distributed (or DDP's Reducer) issued arrived as a begin/end pair.
        assert rep["issued"] == rep["marked"]
        for k in ("collective_begin", "collective_end"):
            assert dict(Counter(mine.loc[mine["kind"] == k, "name"])) == rep["issued"], (rank, k)
    intervals, problems = paired_intervals(markers)
    assert problems == []
    return intervals


def check_phases(markers: pd.DataFrame, split: bool) -> None:
    """One rank's phases: forward, backward, optimizer per step, in that order, never overlapping.

    ``split``: a synchronous collective on CPU tensors (FSDP's all-gathers and reduce-scatters over
    gloo) pauses the phase it blocks, so a phase may come in several pieces.
    """
    begins = markers[markers["kind"] == "phase_begin"].sort_values("ts_ns", kind="stable")
    ends = markers[markers["kind"] == "phase_end"].sort_values("ts_ns", kind="stable")
    got = Counter(zip(begins["step"], begins["name"], strict=True))
    assert got == Counter(zip(ends["step"], ends["name"], strict=True))
    assert set(got) == {(s, p) for s in range(STEPS) for p in PHASES}, got
    if not split:
        assert set(got.values()) == {1}, got
    edges = pd.concat([begins.assign(d=1), ends.assign(d=-1)]).sort_values(["ts_ns", "d"], kind="stable")
    assert edges["d"].cumsum().max() == 1  # never two phases open at once
    for _, g in begins.groupby("step"):
        assert list(dict.fromkeys(g["name"])) == list(PHASES)


def hidden_and_exposed(intervals: pd.DataFrame) -> tuple[float, float]:
    """Collective seconds inside phases (hidden) and outside them (exposed), all ranks and steps."""
    hidden = exposed = 0.0
    for _, iv in intervals.groupby("rank"):
        step = iv["step"].to_numpy(np.int64)
        coll = iv["is_collective"].to_numpy(bool)
        b, e = iv["begin_ns"].to_numpy(np.int64), iv["end_ns"].to_numpy(np.int64)
        n = int(step.max()) + 1
        exp = exposed_seconds(n, step, coll, b, e).sum()
        total = exposed_seconds(n, step[coll], coll[coll], b[coll], e[coll]).sum()  # union of collectives
        hidden += total - exp
        exposed += exp
    return hidden, exposed


@pytest.fixture(autouse=True)
def _no_global_client() -> Iterator[None]:
    chopper.shutdown(0.5)
    yield
    chopper.shutdown(0.5)


@pytest.mark.slow
def test_ddp_markers_from_one_call() -> None:
    markers, reports = run_job("ddp")
    intervals = check_common(markers, reports)
    for rank, rep in reports.items():
        # Several buckets per step, each one all-reduce through the comm hook.
        assert rep["issued"].get("all_reduce", 0) >= 2 * STEPS, rep["issued"]
        # DDP waits for the last bucket after the backward computation ended (how long on each step,
        # against the time it costs, is the truth tests' business).
        assert sum(sync_truth_jobs.exposed_per_step(markers, rank).values()) > 0
    coll = markers[markers["kind"] == "collective_begin"]
    assert (coll.loc[coll["name"] == "all_reduce", "bytes"] > 0).all()
    hidden, _ = hidden_and_exposed(intervals)
    assert hidden > 0  # DDP overlaps bucketed all-reduce with backward


class _Span:
    """One marker pair of ``_Recording``; as with the Client's, ``__exit__`` alone writes the end."""

    def __init__(self, events: list[tuple[str, str]], kind: str, name: str) -> None:
        self.events, self.kind, self.name = events, kind, name

    def __enter__(self) -> _Span:
        self.events.append((f"{self.kind}_begin", self.name))
        return self

    def __exit__(self, *exc: object) -> None:
        self.events.append((f"{self.kind}_end", self.name))


class _Recording:
    """A marker sink with the Client API that keeps (event, name) in call order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def _span(self, kind: str, name: str) -> _Span:
        return _Span(self.events, kind, name)

    def step(self, i: int, flops: float | None = None, tokens: int | None = None) -> Any:
        return self._span("step", str(i))

    def phase(self, name: str) -> Any:
        return self._span("phase", name)

    def collective(self, name: str, bytes: int | None = None) -> Any:
        return self._span("collective", name)


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2"])
def test_backward_ends_before_fsdp_waits_for_its_reduce_scatters(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """FSDP's root post-backward callback (the wait for the reduce-scatters) runs after the phase closed."""
    marks = _Recording()
    if kind == "fsdp1":
        from torch.distributed.fsdp import _runtime_utils

        # Looked up by name when FSDP1 queues it, from the hook it registers inside its forward.
        real1 = _runtime_utils._post_backward_final_callback

        def wrapped1(*args: Any, **kwargs: Any) -> None:
            marks.events.append(("fsdp_final_callback", ""))
            real1(*args, **kwargs)

        monkeypatch.setattr(_runtime_utils, "_post_backward_final_callback", wrapped1)
    else:
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

        real2 = FSDPState._root_post_backward_final_callback

        @functools.wraps(real2)
        def wrapped2(self: Any) -> None:
            marks.events.append(("fsdp_final_callback", ""))
            real2(self)

        monkeypatch.setattr(FSDPState, "_root_post_backward_final_callback", wrapped2)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model: nn.Module = Decoder()
        if kind == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel

            model = FullyShardedDataParallel(model, device_id=torch.device("cpu"))
        else:
            from torch.distributed.fsdp import fully_shard

            fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        inst = ctorch.instrument(model, opt, client=marks)  # type: ignore[arg-type]
        for _ in range(2):
            model(torch.randint(0, VOCAB, (2, SEQ))).sum().backward()
            opt.step()
            opt.zero_grad()
        inst.remove()
    finally:
        dist.destroy_process_group()
    assert inst.errors == {}
    order = [(e, n) for e, n in marks.events if e == "fsdp_final_callback" or e.startswith("phase_")]
    assert order.count(("fsdp_final_callback", "")) == 2, marks.events
    for i, (e, _) in enumerate(order):
        if e == "fsdp_final_callback":
            assert order[i - 1] == ("phase_end", "backward"), order


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2"])
def test_fsdp_markers_from_one_call(kind: str) -> None:
    markers, reports = run_job(kind)
    intervals = check_common(markers, reports)
    for rank, rep in reports.items():
        issued = rep["issued"]
        # One reduce-scatter per FSDP unit per step; at least one all-gather per unit per step (FSDP1
        # over gloo falls back to the list all_gather).
        assert issued.get("reduce_scatter_single", 0) + issued.get("reduce_scatter_tensor", 0) == rep["units"] * STEPS
        gathers = ("all_gather_single", "all_gather_into_tensor", "all_gather")
        assert sum(issued.get(name, 0) for name in gathers) >= rep["units"] * STEPS
        # Each reduce-scatter blocks the gloo rank's backward: exposed on every step.
        exposed = sync_truth_jobs.exposed_per_step(markers, rank)
        assert all(exposed[s] > 0 for s in range(STEPS)), exposed
    # Over gloo FSDP issues its collectives synchronously: each one stops the rank's computation, so
    # none is hidden behind a phase.
    hidden, exposed_total = hidden_and_exposed(intervals)
    assert exposed_total > 0 and hidden <= 0.01 * exposed_total, (hidden, exposed_total)


def test_misuse_is_clear_and_training_continues(caplog: pytest.LogCaptureFixture) -> None:
    model = Decoder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    original = dist.all_reduce
    inst = ctorch.instrument(model, opt, flops_per_step=1e9)
    assert dist.all_reduce is not original
    assert inst.flops_source == "given"
    with pytest.raises(ValueError, match="already instrumented"):
        ctorch.instrument(model, opt)
    inst.remove()
    assert dist.all_reduce is original
    assert len(model._forward_pre_hooks) == 0 and len(model._forward_hooks) == 0
    ctorch.instrument(model, opt).remove()  # after remove() it can be instrumented again

    class NoHooks:  # a custom optimizer: no step hooks
        def step(self) -> None:
            pass

    empty = nn.Identity()
    with caplog.at_level("WARNING", logger="chopper.pytorch"):
        inst = ctorch.instrument(empty, NoHooks(), tokens_per_step=8)
    assert "optimizer_without_hooks" in caplog.text and "model_without_parameters" in caplog.text
    x = torch.ones(2, requires_grad=True)
    for _ in range(3):
        empty(x).sum().backward()
    assert inst.flops_source == "none"
    inst.remove()
    assert inst.steps == 3  # without optimizer hooks a step ends at the next forward (and at remove)


def test_failing_hook_is_counted_and_disabled() -> None:
    class Broken:
        def phase(self, name: str) -> Any:
            raise RuntimeError("boom")

        def step(self, *a: Any) -> Any:
            return chopper.step(0)

        def collective(self, *a: Any, **k: Any) -> Any:
            return chopper.collective("x")

    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inst = ctorch.instrument(model, opt, client=Broken())  # type: ignore[arg-type]
    for _ in range(2):
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
    inst.remove()
    assert inst.errors["forward"] == 1 and "forward" in inst.disabled
    assert inst.errors["optimizer"] == 1


def test_the_old_name_chopper_torch_warns_and_is_the_same_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "chopper.torch", raising=False)  # a cached module would not warn again
    with pytest.warns(DeprecationWarning, match=r"chopper\.torch is deprecated .*import chopper\.pytorch"):
        old = importlib.import_module("chopper.torch")
    assert old.instrument is ctorch.instrument and old.Instrumentation is ctorch.Instrumentation
    assert old.__all__ == ctorch.__all__

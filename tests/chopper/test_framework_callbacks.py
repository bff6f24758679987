"""``chopper.hf`` and ``chopper.lightning`` callbacks on real CPU training; markers at a real gRPC servicer.

Where they assert exposed communication, it is the all-reduce tail after the backward computation,
exposed on every step; the HF Trainer's figure against the step time the job itself loses to gradient
synchronisation, at two link rates, is ``benchmarks/bench_exposed_truth.py``'s.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from torch import nn

import chopper
from chopper.attribution.markers import paired_intervals
from chopper.demo.run import free_port
from tests.support import sync_truth_jobs

PHASES = ("forward", "backward", "optimizer")
STEPS = 3


@pytest.fixture(autouse=True)
def _no_global_client() -> Iterator[None]:
    chopper.shutdown(0.5)
    yield
    chopper.shutdown(0.5)


def received(train: Callable[[str], None]) -> pd.DataFrame:
    """Run ``train(agent)`` against an in-test agent; the markers it received, one row each."""
    return sync_truth_jobs.received("j", lambda target, _: train(target))


def check_steps(markers: pd.DataFrame, steps: int, micro: int = 1) -> None:
    """Every step has one begin/end, one forward and backward per micro-batch and one optimizer phase."""
    assert not markers.empty
    for k in ("step_begin", "step_end"):
        assert sorted(markers.loc[markers["kind"] == k, "step"]) == list(range(steps)), k
    for k in ("phase_begin", "phase_end"):
        sel = markers[markers["kind"] == k]
        got = Counter(zip(sel["step"], sel["name"], strict=True))
        want = Counter({(s, p): 1 if p == "optimizer" else micro for s in range(steps) for p in PHASES})
        assert got == want, (k, got)
    ends = markers[markers["kind"] == "step_end"]
    assert (ends["flops"] > 0).all()
    _, problems = paired_intervals(markers)
    assert problems == []


def test_hf_trainer_callback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CHOPPER_JOB", "hf-test")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    import chopper.hf

    torch.manual_seed(0)
    seq, batch = 16, 4
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (STEPS * batch, seq))]
    cb = chopper.hf.ChopperCallback(tokens_per_step=batch * seq)

    def train(agent: str) -> None:
        monkeypatch.setenv("CHOPPER_AGENT", agent)
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=seq))
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=batch, max_steps=STEPS,
                                 use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                                 dataloader_num_workers=0, disable_tqdm=True)
        Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
        assert cb.instrumentation is None  # removed on train end
        assert len(model._forward_pre_hooks) == 0

    markers = received(train)
    check_steps(markers, STEPS)
    assert (markers.loc[markers["kind"] == "step_end", "tokens"] == batch * seq).all()
    stats = chopper.stats()
    assert stats["dropped"] == 0 and stats["sent"] == stats["queued"] == len(markers)


def _hf_ddp_worker(rank: int, agent: str, port: int, out: str) -> None:
    """One rank of a 2-rank Hugging Face Trainer job: the Trainer wraps the model in DDP itself."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", HF_HUB_OFFLINE="1", CHOPPER_AGENT=agent,
                      CHOPPER_JOB="hf-ddp", CHOPPER_RANK=str(rank), CHOPPER_GPU=str(rank))
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    import chopper.hf

    torch.manual_seed(0)
    torch.set_num_threads(1)
    seq, batch = 16, 4
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (2 * STEPS * batch, seq))]
    cb = chopper.hf.ChopperCallback(tokens_per_step=batch * seq)
    issued: dict[str, int] = {}

    class Keep(TrainerCallback):  # type: ignore[misc]  # reads the counts before on_train_end removes the hooks
        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            issued.update(cb.instrumentation.collectives_issued)

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=seq))
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, max_steps=STEPS, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
                             disable_tqdm=True, ddp_backend="gloo")
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Keep(), cb])
    trainer.train()
    wrapped = isinstance(trainer.model_wrapped, nn.parallel.DistributedDataParallel)
    Path(out, f"{rank}.txt").write_text(f"{wrapped} {issued.get('all_reduce', 0)}")


@pytest.mark.slow
def test_hf_trainer_callback_marks_the_ddp_all_reduce_the_trainer_hides(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch.multiprocessing as mp

    def train(agent: str) -> None:
        mp.spawn(_hf_ddp_worker, args=(agent, free_port(), str(tmp_path)), nprocs=2, join=True)

    markers = received(train)
    for rank in range(2):
        wrapped, all_reduces = (tmp_path / f"{rank}.txt").read_text().split()
        assert wrapped == "True"  # the Trainer, not the test, wrapped the model in DDP
        mine = markers[markers["rank"] == rank]
        check_steps(mine, STEPS)
        begins = mine[(mine["kind"] == "collective_begin") & (mine["name"] == "all_reduce")]
        # At least one gradient bucket per step, each marked through the DDP comm hook, with its bytes.
        assert len(begins) == int(all_reduces) >= STEPS and (begins["bytes"] > 0).all()
        # The tail the Trainer waits for after the backward computation: exposed on every step.
        exposed = sync_truth_jobs.exposed_per_step(mine, rank)
        assert all(exposed[s] > 0 for s in range(STEPS)), exposed


class _LitLM:
    """Builds a small LightningModule (defined lazily: lightning is optional)."""

    @staticmethod
    def make(vocab: int = 64, dim: int = 32) -> Any:
        """An embedding and a two-layer MLP over ``vocab`` tokens of width ``dim``."""
        import lightning.pytorch as pl

        class LitLM(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(vocab, dim)
                self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, vocab))

            def forward(self, tokens: torch.Tensor) -> torch.Tensor:
                return self.mlp(self.embed(tokens))

            def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
                logits = self(batch[:, :-1])
                return nn.functional.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.AdamW(self.parameters(), lr=1e-3)

        return LitLM()


@pytest.mark.parametrize("accumulate", [1, 2])
def test_lightning_callback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, accumulate: int) -> None:
    pytest.importorskip("lightning")
    import lightning.pytorch as pl

    import chopper.lightning

    torch.manual_seed(0)
    batch, seq = 4, 17
    tokens = torch.randint(0, 64, (STEPS * accumulate * batch, seq))
    loader: Any = torch.utils.data.DataLoader(tokens, batch_size=batch)  # type: ignore[arg-type]
    cb = chopper.lightning.ChopperCallback()
    original = torch.distributed.all_reduce

    def train(agent: str) -> None:
        monkeypatch.setenv("CHOPPER_AGENT", agent)
        trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, callbacks=[cb], logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             accumulate_grad_batches=accumulate, default_root_dir=str(tmp_path))
        trainer.fit(_LitLM.make(), loader)

    markers = received(train)
    check_steps(markers, STEPS, accumulate)
    assert cb.errors == {} and cb.steps == STEPS and cb.flops_source == "flop_counter"
    # Tokens from the integer batch: every micro-batch of the step.
    assert (markers.loc[markers["kind"] == "step_end", "tokens"] == accumulate * batch * seq).all()
    assert torch.distributed.all_reduce is original  # restored on train end
    # Phase order inside a step: forward < backward < optimizer.
    begins = markers[markers["kind"] == "phase_begin"].sort_values("ts_ns")
    for _, g in begins.groupby("step"):
        names = list(dict.fromkeys(g["name"]))
        assert names == list(PHASES), names


def _lightning_ddp_worker(rank: int, agent: str, port: int, out: str) -> None:
    """One rank of a 2-rank Lightning DDP job; launched outside Lightning, which it sees from LOCAL_RANK."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), NODE_RANK="0", CHOPPER_AGENT=agent, CHOPPER_JOB="lit-ddp",
                      CHOPPER_RANK=str(rank), CHOPPER_GPU=str(rank))
    import lightning.pytorch as pl

    import chopper.lightning

    torch.manual_seed(0)
    torch.set_num_threads(1)
    batch, seq = 4, 17
    tokens = torch.randint(0, 256, (2 * STEPS * batch, seq))
    loader: Any = torch.utils.data.DataLoader(tokens, batch_size=batch)  # type: ignore[arg-type]
    cb = chopper.lightning.ChopperCallback()
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=2, strategy="ddp", callbacks=[cb],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=out, use_distributed_sampler=False)
    trainer.fit(_LitLM.make(vocab=256, dim=512), loader)
    Path(out, f"{rank}.txt").write_text(f"{type(trainer.strategy).__name__} {cb.steps} {len(cb.errors)}")


@pytest.mark.slow
def test_lightning_ddp_all_reduce_tail_is_exposed(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    import torch.multiprocessing as mp

    def train(agent: str) -> None:
        mp.spawn(_lightning_ddp_worker, args=(agent, free_port(), str(tmp_path)), nprocs=2, join=True)

    markers = received(train)
    for rank in range(2):
        strategy, steps, errors = (tmp_path / f"{rank}.txt").read_text().split()
        assert (strategy, steps, errors) == ("DDPStrategy", str(STEPS), "0")
        mine = markers[markers["rank"] == rank]
        check_steps(mine, STEPS)
        # DDP's gradient buckets, marked through the comm hook on trainer.strategy.model, every step.
        begins = mine[(mine["kind"] == "collective_begin") & (mine["name"] == "all_reduce")]
        assert set(begins["step"]) == set(range(STEPS)) and (begins["bytes"] > 0).all()
        # Backward ends with its computation, before DDP's wait for the last bucket: exposed each step.
        exposed = sync_truth_jobs.exposed_per_step(mine, rank)
        assert all(exposed[s] > 0 for s in range(STEPS)), exposed


def test_pytorch_lightning_variant() -> None:
    pl = pytest.importorskip("pytorch_lightning")
    import chopper.lightning

    assert issubclass(chopper.lightning.PLChopperCallback, pl.Callback)
    assert chopper.lightning.PLChopperCallback().steps == 0


def test_import_chopper_loads_no_framework() -> None:
    code = ("import sys, chopper; bad = [m for m in ('transformers', 'lightning', 'pytorch_lightning', 'torch') "
            "if m in sys.modules]; assert not bad, bad")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_hf_without_transformers_names_the_extra(tmp_path: Path) -> None:
    # A ``transformers`` that cannot be imported, ahead of the real one on the path.
    (tmp_path / "transformers.py").write_text("raise ImportError('no transformers here')\n")
    root = Path(__file__).resolve().parents[2]
    code = ("try:\n    import chopper.hf\nexcept ImportError as e:\n    print(e)\nelse:\n    raise SystemExit(1)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}"})
    assert "chopper-telemetry[hf]" in out.stdout

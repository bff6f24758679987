"""Lightning integration: the markers of ``chopper.pytorch.instrument`` from one callback.

::

    import chopper.lightning
    trainer = L.Trainer(callbacks=[chopper.lightning.ChopperCallback()])

``ChopperCallback`` is a ``lightning.pytorch.Callback`` (``pytorch_lightning.Callback`` when only the
older package is installed; with both installed, ``PLChopperCallback`` is the ``pytorch_lightning`` one).

Lightning runs forward and backward inside ``optimizer.step(closure)``, so the optimizer's step hooks
that ``chopper.pytorch.instrument`` relies on would put the whole step in the optimizer phase. The
callback marks from Lightning's own hooks instead, giving the same markers:

* **step** ``trainer.global_step``: from the batch start of the first micro-batch to the end of
  ``optimizer.step`` (the optimizer's step post-hook; else the end of the batch);
* **forward**: batch start → ``on_before_backward`` (``training_step``, loss included);
* **backward**: ``on_before_backward`` → the end of the backward computation: a gradient hook on the
  loss (the first tensor backward reaches) queues an autograd final callback
  (``chopper.pytorch.queue_backward_end``) ahead of the ones DDP and FSDP queue to wait for gradient
  synchronisation, so that wait is exposed communication, not backward (one phase per micro-batch);
* **optimizer**: ``on_before_optimizer_step`` → end of ``optimizer.step``;
* **collectives** and the **DDP** gradient all-reduce: the ``torch.distributed`` wrappers and comm hook
  of ``chopper.pytorch`` (on ``trainer.strategy.model``, seen through ``torch.compile``); a synchronous
  collective on CPU tensors pauses the phase it blocks, as in ``chopper.pytorch``;
* **FLOPs**: ``flops_per_step`` if given, else counted with ``FlopCounterMode`` over the first
  ``training_step`` (×3), else 6·N·T when tokens are known. Tokens per step: ``tokens_per_step`` if
  given, else the ``numel`` of the batch's token tensor (a tensor batch, its first element, or its
  ``input_ids``) when it is an integer tensor, times the accumulation steps.

On train start the callback calls ``chopper.init()`` unless a client runs (job from the environment,
else the logger's name); on train end (or an exception) it restores ``torch.distributed``, closes any
open marker and, if it started the client, flushes it (``chopper.shutdown``). Markers never raise into
training. Requires the ``lightning`` extra (``pip install 'chopper-telemetry[lightning]'``).
"""
from __future__ import annotations

import contextlib
import logging
from collections import Counter
from typing import Any

try:
    from lightning.pytorch import Callback as _Callback
except ImportError:  # pragma: no cover - pytorch_lightning-only environments
    try:
        from pytorch_lightning import Callback as _Callback  # type: ignore[assignment]
    except ImportError as e:
        raise ImportError(
            "chopper.lightning needs Lightning: pip install 'chopper-telemetry[lightning]' "
            "(or pytorch_lightning>=2.2)"
        ) from e

import torch

import chopper

logger = logging.getLogger("chopper.lightning")

__all__ = ["ChopperCallback"]


def _batch_tokens(batch: Any) -> int | None:
    """Tokens of one micro-batch when its token tensor is recognisable, else None."""
    x = batch
    if isinstance(x, dict):
        x = x.get("input_ids")
    elif isinstance(x, (list, tuple)) and x:
        x = x[0]
    if isinstance(x, torch.Tensor) and not x.is_floating_point() and not x.is_complex():
        return int(x.numel())
    return None


class _ChopperHooks:
    """The callback's behaviour, shared by the ``lightning`` and ``pytorch_lightning`` classes."""

    def __init__(self, job: str | None = None, flops_per_step: float | None = None,
                 tokens_per_step: int | None = None, client: chopper.Client | None = None) -> None:
        """Args: like ``chopper.pytorch.instrument``; ``job`` is for ``chopper.init`` when started here."""
        self.job = job
        self.flops_per_step = flops_per_step
        self.flops_source = "given" if flops_per_step is not None else "none"
        self.tokens_per_step = tokens_per_step
        self.client = client
        self.steps = 0
        self.errors: Counter[str] = Counter()
        self._marks: Any = None
        self._inst: Any = None  # chopper.pytorch.Instrumentation: collectives and the open phase
        self._handles: list[Any] = []
        self._started_client = False
        self._step: int | None = None
        self._flop_mode: Any = None
        self._count_flops = False
        self._tokens_seen = 0

    # ------------------------------------------------------------------------ markers

    def _guard(self, hook: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self.errors[hook] += 1
            logger.warning("event=hook_failed hook=%s note=training continues", hook, exc_info=True)

    def _open_phase(self, name: str) -> None:
        self._inst._open_phase(name)

    def _close_phase(self, name: str | None = None) -> None:
        if self._inst is not None:
            self._inst._close_phase(name)

    def _phase_name(self) -> str | None:
        phase = self._inst._phase if self._inst is not None else None
        return phase[0] if phase is not None else None

    def _end_step(self) -> None:
        self._close_phase()
        self._finish_flop_count()
        if self._step is None:
            return
        tokens = self.tokens_per_step if self.tokens_per_step is not None else (self._tokens_seen or None)
        flops = self.flops_per_step
        if flops is None and tokens is not None and self._inst is not None and self._inst.n_params > 0:
            flops = 6.0 * self._inst.n_params * tokens
            self.flops_source = "6NT"
        self._marks.step(self._step, flops, tokens).__exit__(None, None, None)
        self._step = None
        self._tokens_seen = 0
        self.steps += 1

    def _finish_flop_count(self) -> None:
        mode, self._flop_mode = self._flop_mode, None
        if mode is None:
            return
        mode.__exit__(None, None, None)
        total = float(mode.get_total_flops())
        if total > 0:
            self.flops_per_step = 3.0 * total
            self.flops_source = "flop_counter"

    # ------------------------------------------------------------------------ lifecycle

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Start the client if needed, wrap ``torch.distributed`` and hook the optimizers' steps."""
        import chopper.pytorch as ctorch

        if ctorch.start_callback_client(self.client, self.job,
                                        lambda: getattr(getattr(trainer, "logger", None), "name", None)):
            self._started_client = True
        self._marks = self.client if self.client is not None else chopper
        model = getattr(trainer.strategy, "model", None) or pl_module
        inst = ctorch.Instrumentation(model, None, self._marks, self.flops_per_step, self.tokens_per_step,
                                      int(trainer.global_step), mark_steps=False)
        inst._hook_collectives()
        self._inst = inst
        self._count_flops = self.flops_per_step is None
        for opt in trainer.optimizers:
            if hasattr(opt, "register_step_post_hook"):
                self._handles.append(opt.register_step_post_hook(self._opt_post))

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._guard("optimizer", self._end_step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """Begin the step (first micro-batch) and the forward phase."""
        def begin() -> None:
            if self._step is None:
                self._step = int(trainer.global_step)
                self._marks.step(self._step).__enter__()
                if self._count_flops:
                    self._count_flops = False
                    from torch.utils.flop_counter import FlopCounterMode

                    mode = FlopCounterMode(display=False)
                    mode.__enter__()
                    self._flop_mode = mode
            if self.tokens_per_step is None:
                self._tokens_seen += _batch_tokens(batch) or 0
            self._open_phase("forward")
        self._guard("forward", begin)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        """End forward, begin backward; its end is queued when backward reaches the loss."""
        def go() -> None:
            self._finish_flop_count()
            self._open_phase("backward")
            if loss.requires_grad:
                loss.register_hook(self._loss_grad)
        self._guard("backward", go)

    def _loss_grad(self, grad: torch.Tensor) -> None:
        import chopper.pytorch as ctorch

        self._guard("backward", ctorch.queue_backward_end, self._backward_end)

    def _backward_end(self) -> None:
        # An autograd final callback: _guard keeps any failure out of backward().
        self._guard("backward", self._close_phase, "backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """End backward, begin the optimizer phase."""
        self._guard("optimizer", self._open_phase, "optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """End the step here when the optimizer had no step hook (or the step was skipped)."""
        if self._phase_name() == "optimizer":
            self._guard("optimizer", self._end_step)

    def _teardown(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        with contextlib.suppress(Exception):
            self._end_step()
        import chopper.pytorch as ctorch

        inst, self._inst = self._inst, None
        started, self._started_client = self._started_client, False
        ctorch.end_callback(inst, self.errors, started, logger)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Restore ``torch.distributed``, close open markers, flush a client started here."""
        self._teardown()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Same as ``on_train_end``, when training fails."""
        self._teardown()


class ChopperCallback(_ChopperHooks, _Callback):  # type: ignore[misc]
    """A Lightning callback marking steps, phases and collectives (module docstring).

    Args:
        job: Job id for ``chopper.init`` when the callback starts the client; default from the
            environment, else the trainer's logger name.
        flops_per_step: FLOPs of one optimizer step on this rank, if known (else counted once).
        tokens_per_step: Tokens of one optimizer step on this rank (else from the batch, if possible).
        client: Marker client; default the process-wide one (started here if needed).
    """


def __getattr__(name: str) -> Any:
    """``PLChopperCallback``: the same callback for ``pytorch_lightning.Trainer`` (imported on use)."""
    if name == "PLChopperCallback":
        import pytorch_lightning

        cls = type("PLChopperCallback", (_ChopperHooks, pytorch_lightning.Callback),
                   {"__doc__": ChopperCallback.__doc__, "__module__": __name__})
        globals()[name] = cls
        return cls
    raise AttributeError(name)

"""Hugging Face ``Trainer`` integration: the markers of ``chopper.pytorch.instrument`` from one callback.

::

    import chopper.hf
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[chopper.hf.ChopperCallback()])

On the first training step (when the Trainer has built its optimizer) the callback calls
``chopper.init()`` unless a client is already running (job: ``CHOPPER_JOB``/launcher variables, else
``TrainingArguments.run_name``), then ``chopper.pytorch.instrument(model, optimizer, ...)`` with steps
numbered from ``state.global_step``. On train end the hooks are removed and the markers flushed (the
client is shut down if the callback started it). Evaluation runs under ``no_grad`` and is not marked.

Collectives: those issued from ``torch.distributed`` Python functions (FSDP, DeepSpeed) are marked by
the wrappers of ``chopper.pytorch``. The DDP gradient all-reduce comes from DDP's C++ reducer, and the
Trainer hands callbacks the unwrapped model, so the callback finds the DDP wrapper once, at the first
step, with ``chopper.pytorch.ddp_wrapper_of``, and marks the all-reduce through its comm hook.
Tokens per step are unknown to callbacks: pass ``tokens_per_step=`` when the batch shape is fixed.

Phases are those of ``chopper.pytorch.instrument`` on the model the Trainer calls: the backward phase
ends when the backward computation ends (an autograd final callback queued from the model output's
gradient hook, before DDP's), so the all-reduce tail the Trainer waits for before its optimizer step
is exposed communication. Gradient accumulation: each micro-batch's forward and backward is a phase,
the step ends with the optimizer step that follows the last one (accelerate's wrapper steps the
inner optimizer only then).

Requires the ``hf`` extra (``pip install 'chopper-telemetry[hf]'``); ``import chopper`` does not import
transformers.
"""
from __future__ import annotations

import logging
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - exercised in environments without transformers
    raise ImportError(
        "chopper.hf needs Hugging Face transformers (and accelerate): "
        "pip install 'chopper-telemetry[hf]'"
    ) from e

import chopper

logger = logging.getLogger("chopper.hf")

__all__ = ["ChopperCallback"]


class ChopperCallback(TrainerCallback):  # type: ignore[misc]
    """A ``transformers.TrainerCallback`` marking steps, phases and collectives (module docstring).

    Args:
        job: Job id for ``chopper.init`` when the callback starts the client; default from the
            environment, else ``TrainingArguments.run_name``.
        flops_per_step: FLOPs of one optimizer step on this rank, if known (else counted once).
        tokens_per_step: Tokens of one optimizer step on this rank, if known.
        client: Marker client; default the process-wide one (started here if needed).

    Attributes:
        instrumentation: The active ``chopper.pytorch.Instrumentation`` during training, else None.
    """

    def __init__(self, job: str | None = None, flops_per_step: float | None = None,
                 tokens_per_step: int | None = None, client: chopper.Client | None = None) -> None:
        self.job = job
        self.flops_per_step = flops_per_step
        self.tokens_per_step = tokens_per_step
        self.client = client
        self.instrumentation: Any = None
        self._started_client = False

    def _start(self, args: Any, state: Any, model: Any, optimizer: Any) -> None:
        import torch

        import chopper.pytorch as ctorch

        if self.instrumentation is not None or model is None or optimizer is None:
            return
        if ctorch.start_callback_client(self.client, self.job, lambda: getattr(args, "run_name", None)):
            self._started_client = True
        # The Trainer's optimizer is accelerate's AcceleratedOptimizer: instrument hooks the one inside.
        inst = ctorch.instrument(model, optimizer, self.flops_per_step, self.tokens_per_step,
                                 client=self.client, start_step=int(getattr(state, "global_step", 0) or 0))
        self.instrumentation = inst
        if not any(isinstance(m, torch.nn.parallel.DistributedDataParallel) for m in inst.chain):
            ddp = ctorch.ddp_wrapper_of(model)  # the Trainer wrapped it; callbacks see the inner module
            if ddp is not None:
                inst._register_ddp_hook(ddp)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Instrument now when the optimizer exists already (else on the first step)."""
        self._start(args, state, kwargs.get("model"), kwargs.get("optimizer"))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Instrument before the first step's forward when ``on_train_begin`` had no optimizer."""
        if self.instrumentation is None:
            self._start(args, state, kwargs.get("model"), kwargs.get("optimizer"))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove the hooks and flush the markers."""
        import chopper.pytorch as ctorch

        inst, self.instrumentation = self.instrumentation, None
        started, self._started_client = self._started_client, False
        ctorch.end_callback(inst, inst.errors if inst is not None else {}, started, logger)

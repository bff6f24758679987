"""One-call PyTorch instrumentation: step, phase and collective markers from hooks.

Training code adds one line after ``chopper.init()``::

    chopper.init()
    inst = chopper.torch.instrument(model, optimizer, tokens_per_step=batch.numel())
    for batch in loader:                       # the loop itself is unchanged
        loss = loss_fn(model(batch), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

What is marked and how (all through the public ``chopper.step/phase/collective`` API, or a
``Client`` passed in):

* **forward**: ``register_forward_pre_hook(prepend=True)`` to ``register_forward_hook(always_call=True)``
  on the module passed in only (the outermost; submodules are not hooked). ``prepend`` puts the
  begin before hooks that frameworks registered earlier (FSDP2's root all-gather lands inside).
  Forwards under ``torch.no_grad()`` (evaluation) are not marked.
* **backward**: from the first gradient computed for the forward's output
  (``torch.autograd.graph.register_multi_grad_hook(outputs, mode="any")``) until the optimizer step
  begins (or the next forward, with gradient accumulation). Starting at the output's gradient rather
  than at the end of forward keeps the loss computation and ``zero_grad`` out of the backward phase;
  ending at the optimizer step includes the gradient synchronisation DDP/FSDP finish at the end of
  backward, which is where it belongs.
* **optimizer**: ``optimizer.register_step_pre_hook`` to ``register_step_post_hook``.
* **step**: begins at the first forward after the previous optimizer step and ends when the
  optimizer step ends, numbered from ``start_step``. Pass ``mark_steps=False`` when the loop marks
  steps itself with ``chopper.step()``. An optimizer without step hooks: steps end at the next
  forward instead (and no optimizer phase), with a warning.
* **collectives**: the Python functions of ``torch.distributed`` (``all_reduce``, ``all_gather``,
  ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``broadcast``, ``all_to_all_single``,
  ``barrier``, FSDP2's ``all_gather_single``/``reduce_scatter_single``, DDP's
  ``_broadcast_coalesced``...) are replaced by wrappers while the instrumentation is active. Code
  calls them as ``dist.f(...)`` at call time, which is why wrapping the module attributes is enough
  for FSDP1/FSDP2 (whose collectives are issued from Python). Bytes = the rank's input payload
  (``nbytes`` of the input tensor(s)). Synchronous calls are marked around the call; for
  ``async_op=True`` the window is issue → completion of the work's future **on the CPU side**
  (``Work.get_future().then``), not GPU kernel time. Nested calls (one collective implemented by
  another) are marked once, outermost. ``_coalescing_manager`` batches are seen as their member
  calls.
* **DDP** issues its bucketed gradient all-reduce from C++ (the Reducer), invisible to the wrappers,
  so a DDP comm hook is registered that does exactly what the default hook does (divide by the
  world size, ``all_reduce`` async) inside a collective marker that ends when the all-reduce
  future completes. DDP allows one comm hook per model: one already registered is kept (warning).
* **FLOPs per step** (on ``STEP_END``): ``flops_per_step`` if given (``flops_source == "given"``);
  else counted once with ``torch.utils.flop_counter.FlopCounterMode`` over the first step's forward,
  ×3 for forward + backward (``"flop_counter"``; only that forward pays for the counting); else, when
  that fails and ``tokens_per_step`` is given, 6 · parameters · tokens, right for decoder-only
  transformers (``"6NT"``); else none (``"none"``).

Never raises into training: a hook that fails is counted in ``Instrumentation.errors`` and disabled
(a wrapped collective then just calls the original). Setup errors are raised: instrumenting a model
or optimizer that is already instrumented raises ``ValueError``. ``Instrumentation.remove()``
removes every hook and restores ``torch.distributed`` (a DDP comm hook cannot be unregistered; it
stops marking and keeps averaging gradients as before).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import chopper

logger = logging.getLogger("chopper.torch")

__all__ = ["Instrumentation", "instrument"]

# torch.distributed function → (position, keyword) of the argument whose nbytes is the payload;
# None for collectives without payload.
_PAYLOAD: dict[str, tuple[int, str] | None] = {
    "all_reduce": (0, "tensor"),
    "all_reduce_coalesced": (0, "tensors"),
    "broadcast": (0, "tensor"),
    "reduce": (0, "tensor"),
    "all_gather": (1, "tensor"),
    "all_gather_into_tensor": (1, "input_tensor"),
    "all_gather_single": (1, "input_tensor"),
    "all_gather_coalesced": (1, "input_tensor_list"),
    "gather": (0, "tensor"),
    "scatter": (1, "scatter_list"),
    "reduce_scatter": (1, "input_list"),
    "reduce_scatter_tensor": (1, "input"),
    "reduce_scatter_single": (1, "input"),
    "all_to_all": (1, "input_tensor_list"),
    "all_to_all_single": (1, "input"),
    "barrier": None,
    "_broadcast_coalesced": (1, "tensors"),
}

# Objects instrumented now (ids of live models/optimizers), to refuse a second instrumentation.
_active: weakref.WeakSet[Any] = weakref.WeakSet()
# The instrumentation that owns the torch.distributed wrappers, if any (one per process).
_dist_owner: Instrumentation | None = None
_tls = threading.local()  # .depth: collectives being issued on this thread (nested ones not marked)


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


class Instrumentation:
    """Hooks on one model and optimizer; see the module docstring. Made by ``instrument``.

    Attributes:
        flops_source: ``"given"``, ``"flop_counter"``, ``"6NT"`` or ``"none"``.
        flops_per_step: FLOPs on this rank per step, once known (after the first forward when
            counted).
        collectives_issued: Collectives seen per name (what torch.distributed / DDP issued while
            instrumented, counted before marking).
        collectives_marked: Collective markers completed (begin and end) per name.
        errors: Hook failures per hook name; a failed hook is disabled (``disabled``).
        steps: Steps ended so far.
    """

    def __init__(self, model: nn.Module, optimizer: Any, marks: Any, flops_per_step: float | None,
                 tokens_per_step: int | None, start_step: int, mark_steps: bool) -> None:
        self.model = model
        self.optimizer = optimizer
        self._marks = marks
        self.tokens_per_step = tokens_per_step
        self.mark_steps = mark_steps
        self.flops_per_step: float | None = flops_per_step
        self.flops_source = "given" if flops_per_step is not None else "none"
        self._count_flops = flops_per_step is None
        self.n_params = sum(p.numel() for p in model.parameters())
        self.step_index = start_step
        self.steps = 0
        self.collectives_issued: Counter[str] = Counter()
        self.collectives_marked: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.disabled: set[str] = set()
        self._handles: list[Any] = []
        self._saved_dist: dict[str, Callable[..., Any]] = {}
        self._step_open = False
        self._phase: tuple[str, Any] | None = None
        self._in_forward = False
        self._flop_mode: Any = None
        self._grad_handle: Any = None
        self._has_opt_hooks = False
        self._removed = False

    # ------------------------------------------------------------------ failure containment

    def _fail(self, hook: str) -> None:
        self.errors[hook] += 1
        if hook not in self.disabled:
            self.disabled.add(hook)
            logger.warning("event=hook_failed hook=%s note=hook disabled, training continues", hook, exc_info=True)

    # ------------------------------------------------------------------------ marker state

    def _open_phase(self, name: str) -> None:
        self._close_phase()
        cm = self._marks.phase(name)
        cm.__enter__()
        self._phase = (name, cm)

    def _close_phase(self, name: str | None = None) -> None:
        if self._phase is not None and (name is None or self._phase[0] == name):
            _, cm = self._phase
            self._phase = None
            cm.__exit__(None, None, None)

    def _open_step(self) -> None:
        if self.mark_steps and not self._step_open:
            self._marks.step(self.step_index).__enter__()
            self._step_open = True

    def _close_step(self) -> None:
        self._close_phase()
        if self._step_open:
            # A fresh step object carries the FLOPs known now (the first step's are counted during
            # its forward, after STEP_BEGIN); its __exit__ writes only STEP_END.
            self._marks.step(self.step_index, self.flops_per_step, self.tokens_per_step).__exit__(None, None, None)
            self._step_open = False
        self.step_index += 1
        self.steps += 1

    # ----------------------------------------------------------------------- module hooks

    def _forward_pre(self, module: nn.Module, args: Any) -> None:
        if "forward" in self.disabled or self._in_forward or not torch.is_grad_enabled():
            return
        try:
            self._in_forward = True
            if self._grad_handle is not None:  # the previous forward had no backward
                self._grad_handle.remove()
                self._grad_handle = None
            if not self._has_opt_hooks and self._step_open:
                self._close_step()  # no optimizer hooks: a step ends where the next forward begins
            self._open_step()
            if self._count_flops:
                self._start_flop_count()
            self._open_phase("forward")
        except Exception:
            self._fail("forward")

    def _forward_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if "forward" in self.disabled or not self._in_forward:
            return
        self._in_forward = False
        try:
            self._close_phase("forward")
            self._finish_flop_count()
            from torch.utils._pytree import tree_leaves

            outs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
            if outs:
                self._grad_handle = torch.autograd.graph.register_multi_grad_hook(
                    outs, self._backward_begin, mode="any")
        except Exception:
            self._fail("forward")

    def _start_flop_count(self) -> None:
        # Separate from the forward hook's failure handling: a counter that cannot start must not
        # cost the forward markers.
        try:
            from torch.utils.flop_counter import FlopCounterMode

            mode = FlopCounterMode(display=False)
            mode.__enter__()
            self._flop_mode = mode
        except Exception:
            self._count_flops = False
            self._fail("flop_counter")
            self._fallback_flops()

    def _finish_flop_count(self) -> None:
        mode, self._flop_mode = self._flop_mode, None
        if mode is None:
            return
        self._count_flops = False  # once: later forwards run without the counting mode
        try:
            mode.__exit__(None, None, None)
            total = float(mode.get_total_flops())
            if total > 0:
                self.flops_per_step = 3.0 * total
                self.flops_source = "flop_counter"
                return
        except Exception:
            self._fail("flop_counter")
        self._fallback_flops()

    def _fallback_flops(self) -> None:
        if self.tokens_per_step is not None and self.n_params > 0:
            self.flops_per_step = 6.0 * self.n_params * self.tokens_per_step
            self.flops_source = "6NT"

    def _backward_begin(self, grad: Any) -> None:
        if "backward" in self.disabled:
            return
        try:
            self._grad_handle = None  # fired once per registration
            if self._phase is None or self._phase[0] != "backward":
                self._open_phase("backward")
        except Exception:
            self._fail("backward")

    # -------------------------------------------------------------------- optimizer hooks

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if "optimizer" in self.disabled:
            return
        try:
            self._open_step()  # an optimizer step without a forward still gets a step
            self._open_phase("optimizer")
        except Exception:
            self._fail("optimizer")

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if "optimizer" in self.disabled:
            return
        try:
            self._close_phase("optimizer")
            self._close_step()
        except Exception:
            self._fail("optimizer")

    # ------------------------------------------------------------------------ collectives

    def _wrap(self, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        where = _PAYLOAD[name]
        hook = "collective"

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(_tls, "depth", 0)
            if depth or hook in self.disabled:
                return orig(*args, **kwargs)
            try:
                self.collectives_issued[name] += 1
                nbytes = 0
                if where is not None:
                    pos, kw = where
                    nbytes = _nbytes(args[pos] if len(args) > pos else kwargs.get(kw))
                cm = self._marks.collective(name, bytes=nbytes)
                cm.__enter__()
            except Exception:
                self._fail(hook)
                return orig(*args, **kwargs)
            _tls.depth = depth + 1
            try:
                result = orig(*args, **kwargs)
            except BaseException:
                self._end(cm, name)
                raise
            finally:
                _tls.depth = depth
            if result is not None and hasattr(result, "get_future"):
                try:
                    result.get_future().then(lambda fut: self._end(cm, name))
                except Exception:
                    self._end(cm, name)  # no future for this backend's work: end at issue
            else:
                self._end(cm, name)
            return result

        return wrapper

    def _end(self, cm: Any, name: str) -> None:
        # Runs on the training thread or, for async work, on the backend's completion thread.
        try:
            cm.__exit__(None, None, None)
            self.collectives_marked[name] += 1
        except Exception:
            self._fail("collective")

    def _patch_dist(self) -> None:
        global _dist_owner
        if not dist.is_available():
            return
        if _dist_owner is not None:
            logger.warning("event=dist_already_wrapped note=collectives are marked by the first instrumentation")
            return
        for name in _PAYLOAD:
            orig = getattr(dist, name, None)
            if callable(orig):
                self._saved_dist[name] = orig
                setattr(dist, name, self._wrap(name, orig))
        _dist_owner = self

    def _restore_dist(self) -> None:
        global _dist_owner
        for name, orig in self._saved_dist.items():
            setattr(dist, name, orig)
        self._saved_dist.clear()
        if _dist_owner is self:
            _dist_owner = None

    def _register_ddp_hook(self, ddp: Any) -> None:
        all_reduce = self._saved_dist.get("all_reduce", dist.all_reduce)  # unwrapped: marked here once

        def hook(group: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
            pg: Any = group if group is not None else dist.group.WORLD
            tensor = bucket.buffer()
            cm: Any = None
            if "ddp_comm_hook" not in self.disabled and not self._removed:
                try:
                    self.collectives_issued["all_reduce"] += 1
                    cm = self._marks.collective("all_reduce", bytes=_nbytes(tensor))
                    cm.__enter__()
                except Exception:
                    self._fail("ddp_comm_hook")
                    cm = None
            # Exactly the default hook (default_hooks.allreduce_hook): average by pre-division.
            tensor.div_(pg.size())
            fut = all_reduce(tensor, group=pg, async_op=True).get_future()

            def done(f: torch.futures.Future[Any]) -> torch.Tensor:
                if cm is not None:
                    self._end(cm, "all_reduce")
                return f.value()[0]

            return fut.then(done)

        # DDP validates the hook's annotations against the real classes; under
        # ``from __future__ import annotations`` they are strings, so give it the objects.
        hook.__annotations__ = {"group": object, "bucket": dist.GradBucket,
                                "return": torch.futures.Future[torch.Tensor]}
        try:
            ddp.register_comm_hook(ddp.process_group, hook)
        except Exception as e:  # one comm hook per DDP model: the user's own stays
            logger.warning("event=ddp_comm_hook_skipped error=%r note=DDP gradient all-reduce not marked", e)

    # -------------------------------------------------------------------------- lifecycle

    def _install(self) -> None:
        m = self.model
        self._handles.append(m.register_forward_pre_hook(self._forward_pre, prepend=True))
        self._handles.append(m.register_forward_hook(self._forward_post, always_call=True))
        opt = self.optimizer
        if hasattr(opt, "register_step_pre_hook") and hasattr(opt, "register_step_post_hook"):
            self._handles.append(opt.register_step_pre_hook(self._opt_pre))
            self._handles.append(opt.register_step_post_hook(self._opt_post))
            self._has_opt_hooks = True
        else:
            logger.warning("event=optimizer_without_hooks type=%s note=no optimizer phase; a step ends at the next "
                           "forward (use chopper.step yourself for exact steps)", type(opt).__name__)
        if self.n_params == 0:
            logger.warning("event=model_without_parameters note=no 6NT FLOPs estimate; forward still marked")
        self._patch_dist()
        if isinstance(m, nn.parallel.DistributedDataParallel):
            self._register_ddp_hook(m)

    def remove(self) -> None:
        """Remove every hook, restore ``torch.distributed`` and close an open phase or step."""
        if self._removed:
            return
        self._removed = True
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._grad_handle is not None:
            self._grad_handle.remove()
            self._grad_handle = None
        if self._flop_mode is not None:
            self._finish_flop_count()
        self._restore_dist()
        try:
            self._close_phase()
            if self._step_open:
                self._close_step()
        except Exception:
            self._fail("remove")
        _active.discard(self.model)
        if self.optimizer is not None:
            with contextlib.suppress(TypeError):
                _active.discard(self.optimizer)


def ddp_wrapper_of(module: nn.Module, max_depth: int = 3) -> nn.parallel.DistributedDataParallel | None:
    """The ``DistributedDataParallel`` wrapping ``module``, when a framework wrapped it out of sight.

    The Hugging Face Trainer (through accelerate) wraps the model in DDP and hands its callbacks the
    inner module, so the DDP comm hook that marks the gradient all-reduce has no object to go on.
    DDP holds the module in its ``_modules`` dict, which its instance ``__dict__`` holds.

    Algorithm: breadth-first over the garbage collector's referrer graph from ``module``, following
    dicts only, up to ``max_depth`` levels; the first ``DistributedDataParallel`` whose ``module``
    is ``module`` is the answer. Each level is one ``gc.get_referrers`` pass over the tracked
    objects (tens of ms per million objects), so call it once per training run, never per step.

    Returns:
        The wrapper, or None when torch.distributed is not initialized or nothing wraps ``module``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    frontier: list[Any] = [module]
    for _ in range(max_depth):
        referrers = gc.get_referrers(*frontier)
        for ref in referrers:
            if isinstance(ref, nn.parallel.DistributedDataParallel) and ref.module is module:
                return ref
        frontier = [ref for ref in referrers if isinstance(ref, dict)]
        if not frontier:
            break
    return None


def instrument(model: nn.Module, optimizer: Any, flops_per_step: float | None = None,
               tokens_per_step: int | None = None, *, client: chopper.Client | None = None,
               start_step: int = 0, mark_steps: bool = True) -> Instrumentation:
    """Mark steps, phases and collectives of a plain PyTorch loop from hooks (module docstring).

    Args:
        model: The outermost module the loop calls (the DDP/FSDP wrapper when there is one).
        optimizer: Its optimizer (``torch.optim.Optimizer``; anything else loses the optimizer phase).
        flops_per_step: FLOPs of one step on this rank, if known.
        tokens_per_step: Tokens of one step on this rank; carried on STEP_END and used for 6·N·T.
        client: Marker client; default the process-wide one from ``chopper.init()``.
        start_step: Number of the first step.
        mark_steps: False when the loop marks steps itself with ``chopper.step()``.

    Returns:
        The active instrumentation; ``remove()`` undoes it.

    Raises:
        ValueError: ``model`` or ``optimizer`` is already instrumented (call ``remove()`` first).
    """
    for obj, what in ((model, "model"), (optimizer, "optimizer")):
        try:
            if obj in _active:
                raise ValueError(f"this {what} is already instrumented by chopper.torch.instrument; "
                                 "call .remove() on the first Instrumentation before instrumenting again")
        except TypeError:  # not weak-referenceable: cannot be tracked, cannot be refused either
            pass
    inst = Instrumentation(model, optimizer, client if client is not None else chopper, flops_per_step,
                           tokens_per_step, start_step, mark_steps)
    inst._install()
    for obj in (model, optimizer):
        with contextlib.suppress(TypeError):
            _active.add(obj)
    return inst

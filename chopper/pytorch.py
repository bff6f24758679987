"""One-call PyTorch instrumentation: step, phase and collective markers from hooks.

Training code adds one line after ``chopper.init()``::

    chopper.init()
    inst = chopper.pytorch.instrument(model, optimizer, tokens_per_step=batch.numel())
    for batch in loader:                       # the loop itself is unchanged
        loss = loss_fn(model(batch), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

What is marked and how (all through the public ``chopper.step/phase/collective`` API, or a
``Client`` passed in):

* **forward**: ``register_forward_pre_hook(prepend=True)`` to ``register_forward_hook(always_call=True)``
  on the module passed in (the outermost; submodules are not hooked, except for the output hook
  below). ``prepend`` puts the begin before hooks that frameworks registered earlier (FSDP2's root
  all-gather lands inside). Forwards under ``torch.no_grad()`` (evaluation) are not marked.
* **backward**: from the first gradient computed for the forward's output
  (``torch.autograd.graph.register_multi_grad_hook(outputs, mode="any")``) until the autograd engine
  has run every node of that backward: the output's hook queues an engine final callback
  (``Variable._execution_engine.queue_callback``) that closes the phase. The engine runs final
  callbacks in the order they were queued, after the last node; DDP's Reducer queues its
  ``finalize_backward`` (which waits for the bucket all-reduces) when its last bucket is ready, and
  FSDP1/FSDP2 queue their root post-backward callbacks (which wait for the reduce-scatters) from
  hooks on the forward's outputs, so the backward phase ends where the backward *computation*
  ends and the gradient synchronisation still running then is exposed (docs/ATTRIBUTION.md). To be
  queued first, the output hook is registered by a forward hook with ``prepend=True`` (before
  FSDP2's post-forward hook registers its own) on the module whose outputs come first in backward
  without a framework hook on them already: through ``torch.compile``'s ``OptimizedModule``, FSDP1
  (which hooks its outputs inside its own ``forward``) and DeepSpeed's engine down to the module
  they wrap, never inside DDP (whose ``_DDPSink`` may queue the static-graph all-reduce). The final
  callback runs with the caller's streams, synchronised with every stream backward used, so with
  device-event timestamps (``chopper._device_clock``) the phase ends when the device finished the
  backward kernels, not when the host got there; without a GPU it is a CPU timestamp (the agent
  flags ``cpu_clock``). Starting at the output's gradient rather than at the end of forward keeps
  the loss computation and ``zero_grad`` out of the backward phase; with gradient accumulation
  each backward is its own phase.
* **optimizer**: ``optimizer.register_step_pre_hook`` to ``register_step_post_hook`` on the
  ``torch.optim.Optimizer`` inside the wrappers libraries put around it (``unwrap_optimizer``:
  accelerate's ``AcceleratedOptimizer``, DeepSpeed's ZeRO/FP16 optimizers, Lightning's
  ``LightningOptimizer``); its hooks run when the wrapper really steps, so a step skipped under
  gradient accumulation is no step.
* **wrappers** around the model (``wrapper_chain``): ``torch.compile``'s ``OptimizedModule``
  (``_orig_mod``), ``DistributedDataParallel`` and DeepSpeed's engine (``module``) and FSDP1
  (``_fsdp_wrapped_module``) are seen through to find DDP (for its comm hook) and the module whose
  outputs carry the backward hook.
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
  calls. A synchronous call on CPU tensors (gloo) blocks the thread that computes until it is done,
  so the phase that thread opened is ended before the call and begun again after it: that
  collective is exposed, not hidden behind the phase it interrupted.
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
import itertools
import logging
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import chopper
from chopper.identity import process as _identity

logger = logging.getLogger("chopper.pytorch")

__all__ = ["Instrumentation", "instrument", "queue_backward_end", "unwrap_optimizer", "wrapper_chain"]

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


# Wrapper classes seen through by name (their libraries are optional and never imported here):
# qualified class name → attribute holding the wrapped module. Each either hooks the wrapped
# module's outputs inside its own forward (FSDP1, DeepSpeed ZeRO-3) or adds nothing to them
# (torch.compile), so the backward-begin hook goes below them, on the wrapped module's outputs.
_WRAPPED_BY_NAME = {
    "torch._dynamo.eval_frame.OptimizedModule": "_orig_mod",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel": "_fsdp_wrapped_module",
    "deepspeed.runtime.engine.DeepSpeedEngine": "module",
}


def _wrapper_name(module: Any) -> str | None:
    """The ``_WRAPPED_BY_NAME`` key of ``module``'s class or a base class, if any."""
    for cls in type(module).__mro__:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in _WRAPPED_BY_NAME:
            return name
    return None


def wrapper_chain(model: nn.Module, max_depth: int = 8) -> list[nn.Module]:
    """``model`` and the modules it wraps, outermost first.

    Followed: ``DistributedDataParallel.module``, ``torch.compile``'s ``OptimizedModule._orig_mod``,
    FSDP1's ``_fsdp_wrapped_module`` and DeepSpeed's ``DeepSpeedEngine.module`` (also through
    subclasses such as its pipeline engine), at most ``max_depth`` modules. ``DataParallel`` is not
    followed: its replicas run the hooks on other threads.
    """
    chain = [model]
    while len(chain) < max_depth:
        m = chain[-1]
        if isinstance(m, nn.parallel.DistributedDataParallel):
            inner = m.module
        else:
            name = _wrapper_name(m)
            inner = getattr(m, _WRAPPED_BY_NAME[name], None) if name is not None else None
        if not isinstance(inner, nn.Module) or inner is m:
            break
        chain.append(inner)
    return chain


def _output_hook_module(chain: list[nn.Module]) -> nn.Module:
    """The module whose forward outputs get the backward-begin hook (module docstring, backward)."""
    target = chain[0]
    for outer, inner in itertools.pairwise(chain):
        if _wrapper_name(outer) is None:  # DDP or the end of the chain
            break
        target = inner
    return target


def _hooked_optimizers(optimizer: Any, max_depth: int = 8) -> Iterator[Any]:
    """``optimizer`` and the optimizers it wraps (``optimizer`` / ``_optimizer`` attributes), outermost first."""
    seen: set[int] = set()
    while optimizer is not None and id(optimizer) not in seen and len(seen) < max_depth:
        seen.add(id(optimizer))
        yield optimizer
        inner = getattr(optimizer, "optimizer", None)
        optimizer = inner if inner is not None else getattr(optimizer, "_optimizer", None)


def _has_step_hooks(optimizer: Any) -> bool:
    # A torch.optim.Optimizer subclass that never ran Optimizer.__init__ (accelerate's wrapper) has
    # the methods but not the hook dicts they write to.
    return (isinstance(getattr(optimizer, "_optimizer_step_pre_hooks", None), dict)
            and isinstance(getattr(optimizer, "_optimizer_step_post_hooks", None), dict)
            and callable(getattr(optimizer, "register_step_pre_hook", None)))


def unwrap_optimizer(optimizer: Any) -> Any:
    """The optimizer whose ``step`` runs ``torch.optim`` step hooks: ``optimizer`` or one it wraps.

    Looks through ``.optimizer`` (accelerate's ``AcceleratedOptimizer``, DeepSpeed's ZeRO and FP16
    optimizers) and ``._optimizer`` (Lightning's ``LightningOptimizer``) for the outermost object
    with initialised step hooks (TorchTitan's ``OptimizersContainer`` has its own); ``optimizer``
    itself when none has.
    """
    for opt in _hooked_optimizers(optimizer):
        if _has_step_hooks(opt):
            return opt
    return optimizer


def queue_backward_end(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the running backward has executed its last node.

    Call from inside a backward (a tensor or node hook): the autograd engine runs its final callbacks
    in the order they were queued once every node has run, with the caller's streams (synchronised
    with the streams backward used), before ``backward()`` returns. Callbacks that DDP and FSDP
    queue later (waiting for gradient synchronisation) run after this one.
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)  # type: ignore[attr-defined]


def _on_cpu(x: Any) -> bool:
    """True when ``x`` is (or holds) a CPU tensor: a collective on it runs on the host (gloo)."""
    if isinstance(x, torch.Tensor):
        return x.device.type == "cpu"
    if isinstance(x, (list, tuple)) and x:
        return _on_cpu(x[0])
    return False


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
        self.chain = wrapper_chain(model)
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
        self._phase: tuple[str, Any, int] | None = None  # (name, context manager, opening thread)
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
        self._phase = (name, cm, threading.get_ident())

    def _close_phase(self, name: str | None = None) -> None:
        if self._phase is not None and (name is None or self._phase[0] == name):
            cm = self._phase[1]
            self._phase = None
            cm.__exit__(None, None, None)

    def _pause_phase(self) -> str | None:
        """Close the phase this thread opened, for a collective that blocks it; its name, else None."""
        phase = self._phase
        if phase is None or phase[2] != threading.get_ident():
            return None
        self._close_phase()
        return phase[0]

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
        except Exception:
            self._fail("forward")

    def _hook_outputs(self, module: nn.Module, args: Any, output: Any) -> None:
        # Runs before any later forward hook of this module (prepend=True), so the backward-begin
        # hook comes before the ones frameworks register on the same tensors.
        if "backward" in self.disabled or not self._in_forward or self._grad_handle is not None:
            return
        try:
            from torch.utils._pytree import tree_leaves

            outs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
            if outs:
                self._grad_handle = torch.autograd.graph.register_multi_grad_hook(
                    outs, self._backward_begin, mode="any")
        except Exception:
            self._fail("backward")

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
            queue_backward_end(self._backward_end)
        except Exception:
            self._fail("backward")

    def _backward_end(self) -> None:
        # An autograd final callback: an exception here would surface from backward() itself.
        try:
            self._close_phase("backward")
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
            paused: str | None = None
            try:
                self.collectives_issued[name] += 1
                payload = None
                if where is not None:
                    pos, kw = where
                    payload = args[pos] if len(args) > pos else kwargs.get(kw)
                if not kwargs.get("async_op", False) and _on_cpu(payload):
                    # A synchronous collective on CPU tensors blocks this thread until it is done:
                    # the phase computes nothing meanwhile, so it is paused around the call.
                    paused = self._pause_phase()
                cm = self._marks.collective(name, bytes=_nbytes(payload))
                cm.__enter__()
            except Exception:
                self._fail(hook)
                return orig(*args, **kwargs)
            _tls.depth = depth + 1
            try:
                result = orig(*args, **kwargs)
            except BaseException:
                self._end(cm, name)
                self._resume_phase(paused)
                raise
            finally:
                _tls.depth = depth
            if paused is not None:
                self._end(cm, name)  # first, so the resumed phase covers none of the collective
                self._resume_phase(paused)
            elif result is not None and hasattr(result, "get_future"):
                try:
                    result.get_future().then(lambda fut: self._end(cm, name))
                except Exception:
                    self._end(cm, name)  # no future for this backend's work: end at issue
            else:
                self._end(cm, name)
            return result

        return wrapper

    def _resume_phase(self, phase: str | None) -> None:
        if phase is None:
            return
        try:
            if self._phase is None:  # nothing else opened one meanwhile
                self._open_phase(phase)
        except Exception:
            self._fail("collective")

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
        self._handles.append(_output_hook_module(self.chain).register_forward_hook(self._hook_outputs, prepend=True))
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
        self._hook_collectives()

    def _hook_collectives(self) -> None:
        """Wrap ``torch.distributed`` and mark the gradient all-reduce of a DDP in the wrapper chain."""
        self._patch_dist()
        ddp = next((w for w in self.chain if isinstance(w, nn.parallel.DistributedDataParallel)), None)
        if ddp is not None:
            self._register_ddp_hook(ddp)

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
        model: The outermost module the loop calls (the DDP/FSDP/compiled/DeepSpeed wrapper when there
            is one: ``accelerator.prepare``'s model, ``deepspeed.initialize``'s engine).
        optimizer: Its optimizer: a ``torch.optim.Optimizer`` or a wrapper around one
            (``unwrap_optimizer``); one without step hooks loses the optimizer phase.
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
    hooked = unwrap_optimizer(optimizer)
    for obj, what in ((model, "model"), (hooked, "optimizer")):
        try:
            if obj in _active:
                raise ValueError(f"this {what} is already instrumented by chopper.pytorch.instrument; "
                                 "call .remove() on the first Instrumentation before instrumenting again")
        except TypeError:  # not weak-referenceable: cannot be tracked, cannot be refused either
            pass
    inst = Instrumentation(model, hooked, client if client is not None else chopper, flops_per_step,
                           tokens_per_step, start_step, mark_steps)
    inst._install()
    for obj in (model, hooked):
        with contextlib.suppress(TypeError):
            _active.add(obj)
    return inst


def start_callback_client(client: chopper.Client | None, job: str | None,
                          framework_job: Callable[[], str | None]) -> bool:
    """A framework callback's client: start the process-wide one unless ``client`` is given or one runs.

    The job is ``job``, else what the environment names (``chopper.init``), else, when it names
    none, ``framework_job()`` (the Trainer's run name, the Lightning logger's name).

    Returns:
        True when a client was started here: the callback then flushes it at its end
        (``end_callback``).
    """
    if client is not None or chopper._client is not None:
        return False
    if job is None and _identity.default_job(os.environ) == "default":
        job = framework_job() or None
    chopper.init(job=job)
    return True


def end_callback(inst: Instrumentation | None, errors: Mapping[str, int], started_client: bool,
                 log: logging.Logger) -> None:
    """A framework callback's end: remove ``inst``'s hooks, warn once of hook ``errors`` (by hook),
    and flush and stop the client when the callback started it."""
    if inst is not None:
        inst.remove()
    if errors:
        log.warning("event=hook_errors errors=%s", dict(errors))
    if started_client:
        chopper.shutdown()

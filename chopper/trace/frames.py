"""Column contract of a parsed Kineto / PyTorch-profiler trace (one rank).

Times are int64 nanoseconds on the trace's own clock (Kineto's microsecond ``ts`` × 1000,
rounded), durations int64 nanoseconds. Every analysis in ``chopper.trace`` takes these frames.

``kernels``: one row per GPU activity (``cat`` kernel, gpu_memcpy, gpu_memset).
``runtime``: one row per CUDA/HIP runtime call (launches, synchronize, memcpy calls).
``cpu_ops``: one row per CPU-side range: ``cpu_op``, ``user_annotation`` (``ProfilerStep#N``,
``record_function`` ranges, FSDP ranges), ``python_function``.
``gpu_annotations``: ``gpu_user_annotation`` ranges on the GPU timeline.
``flows``: forward↔backward flow events (``fwdbwd``) and other flows, one row per endpoint.
"""
from __future__ import annotations

KERNEL_COLUMNS: tuple[str, ...] = (
    "name", "cat", "ts_ns", "dur_ns", "end_ns", "device", "stream", "correlation",
)
RUNTIME_COLUMNS: tuple[str, ...] = ("name", "ts_ns", "dur_ns", "end_ns", "pid", "tid", "correlation")
CPU_OP_COLUMNS: tuple[str, ...] = ("name", "cat", "ts_ns", "dur_ns", "end_ns", "pid", "tid", "external_id")
GPU_ANNOTATION_COLUMNS: tuple[str, ...] = ("name", "ts_ns", "dur_ns", "end_ns", "device", "stream")
FLOW_COLUMNS: tuple[str, ...] = ("id", "cat", "phase", "ts_ns", "pid", "tid")

# Kernel classes (one table, tested in order; first match wins). The first three are the
# definitions Holistic Trace Analysis uses for its temporal breakdown (REFERENCE.md);
# the finer classes split "computation" for the kernel-type and top-kernel views.
KERNEL_CLASSES: tuple[str, ...] = ("COMMUNICATION", "MEMORY", "COMPUTATION")

"""Which workload owns each GPU, from the scheduler's side: Slurm's mapping directory and the kubelet.

Training scripts that call ``chopper.init`` name their job themselves; this module labels GPUs
whose job is not instrumented. Two sources, each optional (an empty setting turns it off):

- ``jobmap``: the directory the Slurm prolog writes (``agent.jobmap``), giving job ids.
- ``podresources``: the kubelet's PodResourcesLister (``agent.podresources``), giving namespace,
  pod and container.

A ``WorkloadTracker`` thread reads every source each ``workload_refresh_s`` (never the sampler
thread: a wedged kubelet must not delay a sample) and swaps in a new, immutable table. A source
that fails keeps its last good reading, shows ``chopper_agent_workload_source_up{source}=0`` and
counts the failure by kind; the agent keeps serving.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from agent.jobmap import JobMapUnreadable, read_job_map
from agent.podresources import PodResourcesClient, PodResourcesUnavailable, assignments

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class Workload:
    """One owner of one GPU, as one source sees it; fields a source does not know are empty."""

    source: str
    job: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""


@runtime_checkable
class PciAddressed(Protocol):
    """Optional extra of a backend: each GPU's PCI bus id, which AMD's device plugin uses as device id."""

    def pci_bus_ids(self) -> dict[int, str]:
        """GPU index → PCI bus id (``0000:c1:00.0``), read at ``open()``."""
        ...


@dataclass
class SourceHealth:
    """What the metrics say about one source."""

    up: bool = False
    errors: Counter[str] = field(default_factory=Counter)


class Source(Protocol):
    name: str
    health: SourceHealth

    def read(self, ids: Mapping[str, int]) -> dict[int, list[Workload]]:
        """GPU index → owners. Raises ``SourceFailed`` when the source cannot be read."""
        ...


class SourceFailed(RuntimeError):
    """A source could not be read; ``kind`` is the error counter's label."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class JobMapSource:
    """Job ids from the Slurm prolog's mapping directory; bad files are counted, the rest still read.

    A bad file is logged and counted when it turns up, not again on every refresh while it stays bad.
    """

    name = "jobmap"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.health = SourceHealth()
        self._problems: frozenset[str] = frozenset()  # those of the last reading, each logged and counted once

    def read(self, ids: Mapping[str, int]) -> dict[int, list[Workload]]:
        try:
            reading = read_job_map(self.directory)
        except JobMapUnreadable as exc:
            raise SourceFailed("unreadable", str(exc)) from None
        problems = frozenset(reading.problems)
        for problem in sorted(problems - self._problems):  # a file stays bad for many refreshes: say it once
            log.warning("event=job_mapping_file_bad problem=%r", problem)
        self.health.errors["bad_file"] += len(problems - self._problems)
        self._problems = problems
        return {gpu: [Workload(self.name, job=job) for job in jobs] for gpu, jobs in reading.jobs.items()}


class PodResourcesSource:
    """Namespace, pod and container from the kubelet's pod-resources socket."""

    name = "podresources"

    def __init__(self, client: PodResourcesClient) -> None:
        self.client = client
        self.health = SourceHealth()

    def read(self, ids: Mapping[str, int]) -> dict[int, list[Workload]]:
        try:
            reply = self.client.list()
        except PodResourcesUnavailable as exc:
            raise SourceFailed("unavailable", str(exc)) from None
        return {
            gpu: [Workload(self.name, namespace=c.namespace, pod=c.pod, container=c.container) for c in holders]
            for gpu, holders in assignments(reply, ids).items()
        }


class WorkloadTracker:
    """Refreshes every source on its own thread and serves the merged table.

    Args:
        sources: The sources that are switched on.
        refresh_s: Seconds between readings.
    """

    def __init__(self, sources: list[Source], refresh_s: float) -> None:
        self.sources = sources
        self.refresh_s = refresh_s
        self._ids: Mapping[str, int] = {}
        self._parts: dict[str, dict[int, list[Workload]]] = {s.name: {} for s in sources}
        # Replaced whole, never mutated: readers on other threads take a reference without a lock.
        self._table: dict[int, tuple[Workload, ...]] = {}
        self._jobs: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set_device_ids(self, ids: Mapping[str, int]) -> None:
        """Device-plugin id → GPU index (``agent.podresources.device_ids``), after every backend open."""
        self._ids = dict(ids)

    def table(self) -> dict[int, tuple[Workload, ...]]:
        """GPU index → its owners from every source, sorted."""
        return self._table

    def jobs(self) -> dict[int, str]:
        """GPU index → the job ids owning it, comma-separated (jobs sharing a GPU), for samples."""
        return self._jobs

    def refresh(self) -> None:
        """Read every source once and publish the merged table."""
        for source in self.sources:
            health = source.health
            try:
                self._parts[source.name] = source.read(self._ids)
            except SourceFailed as exc:
                if health.up or not health.errors:
                    log.warning("event=workload_source_down source=%s error=%r", source.name, str(exc))
                health.up = False
                health.errors[exc.kind] += 1
                continue
            except Exception as exc:  # a source bug must not end the refresh thread or the agent
                log.warning("event=workload_source_failed source=%s error=%r", source.name, str(exc))
                health.up = False
                health.errors["error"] += 1
                continue
            health.up = True
        merged: dict[int, list[Workload]] = {}
        for part in self._parts.values():
            for gpu, owners in part.items():
                merged.setdefault(gpu, []).extend(owners)
        table = {gpu: tuple(sorted(owners)) for gpu, owners in sorted(merged.items())}
        if table != self._table:
            log.info("event=workload_changed gpus=%s", _describe(table))
        self._jobs = {gpu: ",".join(w.job for w in owners if w.job) for gpu, owners in table.items()}
        self._table = table

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chopper-workload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for source in self.sources:
            if isinstance(source, PodResourcesSource):
                source.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_s)


def build_tracker(job_mapping_dir: str, pod_resources_socket: str, refresh_s: float) -> WorkloadTracker | None:
    """The tracker for these settings, or None when both sources are off."""
    sources: list[Source] = []
    if job_mapping_dir:
        sources.append(JobMapSource(Path(job_mapping_dir)))
    if pod_resources_socket:
        sources.append(PodResourcesSource(PodResourcesClient(pod_resources_socket)))
    return WorkloadTracker(sources, refresh_s) if sources else None


def _describe(table: Mapping[int, tuple[Workload, ...]]) -> str:
    parts = [
        f"{gpu}:{w.source}:{w.job or '/'.join(filter(None, (w.namespace, w.pod, w.container)))}"
        for gpu, owners in table.items() for w in owners
    ]
    return ",".join(parts) or "-"

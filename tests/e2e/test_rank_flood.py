"""A flood of made-up (job, rank)s against a real agent: every per-rank structure stays within max_ranks.

A real ``chopper-agent`` (``--max-ranks 100``, access limits off so that the flood is as fast as
gRPC takes it) serves one well-behaved trainer, always inside a step as a training loop is, while
eight streams push 2,000 ranks that each close one step (half of them naming a GPU the node does
not have, which the agent warns about once per rank) and then 2,000 ranks that each open a step and
never end it. Measured from outside the process: the ranks the agent reports during the flood,
what each stream was told (accepted, rejected), the rejection counters, the bytes of ``/metrics``
against the bytes one rank costs, the agent's log lines and its RSS.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest

from chopper.demo.run import metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from tests.support.daemons import AgentProcess
from tests.support.hazards import HazardOutcome
from tests.support.polling import wait_until

MAX_RANKS = 100
FLOOD_RANKS = 2000  # per phase
STREAMS = 8
B, E = pb.MARKER_KIND_STEP_BEGIN, pb.MARKER_KIND_STEP_END
PB, PE = pb.MARKER_KIND_PHASE_BEGIN, pb.MARKER_KIND_PHASE_END


def marker(kind: pb.MarkerKind, step: int, name: str = "", **fields: float) -> pb.Marker:
    return pb.Marker(kind=kind, step=step, ts_ns=time.time_ns(), name=name, **fields)  # type: ignore[arg-type]


class Trainer(threading.Thread):
    """One rank stepping every 20 ms on one stream; between its batches a step is always open."""

    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(name="trainer")
        self.push = channel.stream_unary("/chopper.v1.Agent/PushMarkers",
                                         request_serializer=pb.MarkerBatch.SerializeToString,
                                         response_deserializer=pb.PushMarkersResponse.FromString)
        self.stop = threading.Event()
        self.sent = 0
        self.steps = 0
        self.response: pb.PushMarkersResponse | None = None

    def batches(self) -> Iterator[pb.MarkerBatch]:
        step = 0
        while True:
            markers = [marker(E, step - 1, flops=1e12, tokens=64)] if step else []
            self.steps = step  # steps closed so far
            if self.stop.is_set():
                self._count(markers)
                if markers:
                    yield pb.MarkerBatch(job="train", rank=0, gpu=0, seq=step + 1, pid=1, markers=markers)
                return
            markers += [marker(B, step), marker(PB, step, "forward"), marker(PE, step, "forward")]
            self._count(markers)
            yield pb.MarkerBatch(job="train", rank=0, gpu=0, seq=step + 1, pid=1, markers=markers)
            step += 1
            time.sleep(0.02)

    def _count(self, markers: list[pb.Marker]) -> None:
        self.sent += len(markers)

    def run(self) -> None:
        self.response = self.push(self.batches(), timeout=300)


def flood(channel: grpc.Channel, first: int, closed: bool) -> tuple[int, int, int]:
    """Push FLOOD_RANKS new ranks over STREAMS streams; (markers offered, accepted, rejected)."""
    push = channel.stream_unary("/chopper.v1.Agent/PushMarkers", request_serializer=pb.MarkerBatch.SerializeToString,
                                response_deserializer=pb.PushMarkersResponse.FromString)
    per_batch = 2 if closed else 1

    def batches(k: int) -> Iterator[pb.MarkerBatch]:
        for i in range(first + k, first + FLOOD_RANKS, STREAMS):
            markers = [marker(B, 0), marker(E, 0)] if closed else [marker(B, 0)]
            yield pb.MarkerBatch(job=f"flood-{i % 37}", rank=i, gpu=9 if i % 2 else i % 4, seq=1, pid=7,
                                 markers=markers)

    responses: list[pb.PushMarkersResponse] = []
    threads = [threading.Thread(target=lambda k=k: responses.append(push(batches(k), timeout=300)))
               for k in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(responses) == STREAMS
    return FLOOD_RANKS * per_batch, sum(r.accepted for r in responses), sum(r.rejected for r in responses)


@pytest.mark.slow
@pytest.mark.hazard(item=12, input="4,000 made-up (job, rank)s pushed as fast as gRPC takes them (2,000 closing a "
                    "step, half on a GPU the node lacks; 2,000 opening one), max_ranks 100, beside a trainer",
                    promise="per-rank state bounded by max_ranks whatever a client sends; what is refused is "
                    "counted; the scrape stays small; a live rank inside a step keeps its state")
def test_a_flood_of_ranks_stays_within_max_ranks(tmp_path: Path, hazard: HazardOutcome) -> None:
    agent = AgentProcess(tmp_path, "--max-ranks", str(MAX_RANKS), "--rate-limit-calls-per-s", "0",
                         "--rate-limit-messages-per-s", "0").start()
    channel = grpc.insecure_channel(agent.target)
    try:
        process = psutil.Process(agent.proc.pid)  # type: ignore[union-attr]
        empty = len(agent.metrics())
        trainer = Trainer(channel)
        trainer.start()
        assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_rank_steps_total",
                                             training_job="train") >= 20, 30)
        one_rank = len(agent.metrics()) - empty  # the trainer's series: more than any flood rank has
        rss_before = process.memory_info().rss

        tracked: list[float] = []
        scraping = threading.Event()

        def scrape() -> None:
            while not scraping.wait(0.2):
                tracked.append(metric_sum(agent.metrics(), "chopper_agent_ranks"))

        scraper = threading.Thread(target=scrape)
        scraper.start()
        started = time.monotonic()
        offered_closed, accepted_closed, rejected_closed = flood(channel, 0, closed=True)
        offered_open, accepted_open, rejected_open = flood(channel, FLOOD_RANKS, closed=False)
        flood_s = time.monotonic() - started
        scraping.set()
        scraper.join()
        trainer.stop.set()
        trainer.join()
        rss_after = process.memory_info().rss

        t0 = time.perf_counter()
        text = agent.metrics()
        scrape_s = time.perf_counter() - t0
        refused = metric_sum(text, "chopper_agent_markers_rejected_total", reason="too_many_ranks")
        retired = metric_sum(text, "chopper_agent_ranks_retired_total", reason="limit")
        # The trainer lost nothing: every marker accepted, every step summarised, on its own series.
        assert trainer.response is not None
        assert (trainer.response.accepted, trainer.response.rejected) == (trainer.sent, 0)
        assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_rank_steps_total", training_job="train")
                          == trainer.steps, 10)
        # Bounded: never more than max_ranks tracked, and the scrape holds no more than that many ranks.
        assert tracked and max(tracked) <= MAX_RANKS, max(tracked)
        assert metric_sum(text, "chopper_agent_ranks") <= MAX_RANKS
        assert len(text) - empty <= MAX_RANKS * one_rank, (len(text), empty, one_rank)
        # Counted: every flood marker accepted or rejected, each rejection answered and counted by reason.
        assert accepted_closed + rejected_closed == offered_closed and accepted_open + rejected_open == offered_open
        assert rejected_closed + rejected_open == refused and rejected_open > 0
        # Finished ranks made room for new ones: several times max_ranks got in, each beyond the first max_ranks
        # by retiring a finished one (how many depends on how fast the sampler closes their summaries against the
        # flood's pace, so no fraction of the offered is asserted); ranks inside a step made none: the open
        # phase got only what finished ones left.
        assert accepted_closed / 2 >= 3 * MAX_RANKS and retired >= accepted_closed / 2 - MAX_RANKS
        assert accepted_open <= MAX_RANKS
        assert metric_sum(text, "chopper_agent_markers_rejected_total") == refused  # nothing else was rejected
        # The log: one warning per made-up rank on a missing GPU would be 1,000 lines.
        warnings = [line for line in agent.log().splitlines() if "event=unknown_device" in line]
        assert 1 <= len(warnings) <= 20, len(warnings)
        assert rss_after < 1.5 * rss_before, (rss_before, rss_after)
        hazard.outcome = (
            f"{2 * FLOOD_RANKS:,} ranks in {flood_s:.1f} s: at most {max(tracked):.0f} of max_ranks {MAX_RANKS} "
            f"tracked in {len(tracked)} scrapes; {retired:.0f} finished ranks retired for room, {refused:.0f} of "
            f"{offered_closed + offered_open:,} markers of new ranks refused as too_many_ranks (answered and counted, "
            f"{rejected_open:,} of them from ranks opening a step); /metrics {empty:,} -> {len(text):,} bytes "
            f"(bound {MAX_RANKS} x {one_rank:,} B per rank), scraped in {scrape_s:.2f} s; RSS "
            f"{rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB; trainer {trainer.sent} of {trainer.sent} "
            f"markers accepted, {trainer.steps} steps summarised; {len(warnings)} unknown_device log lines for "
            f"{FLOOD_RANKS // 2:,} such ranks")
    finally:
        channel.close()
        agent.terminate()

"""A real agent labels GPUs with their owners: the Slurm prolog's job ids and the kubelet's pods.

The agent process reads a mapping directory written by deploy/slurm/chopper-jobmap.sh and asks an
in-test kubelet (PodResourcesLister over a unix socket); /metrics and the sample stream show it,
and a kubelet that goes away leaves the agent serving with the source reported down.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from agent.kubelet.podresources.v1 import api_pb2 as kpb
from chopper.demo.run import metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.runs import consumer
from tests.support.daemons import AgentProcess
from tests.support.kubelet import KubeletPodResources, container, pod
from tests.support.polling import wait_until

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "chopper-jobmap.sh"


def slurm(context: str, mapdir: Path, job: str, gpus: str) -> None:
    subprocess.run(
        ["/bin/sh", str(SCRIPT)], check=True, timeout=30,
        env={"SLURM_SCRIPT_CONTEXT": context, "SLURM_JOB_ID": job, "SLURM_JOB_GPUS": gpus,
             "CHOPPER_JOB_MAPPING_DIR": str(mapdir)},
    )


def info_series(metrics: str, **labels: str) -> float:
    return metric_sum(metrics, "chopper_gpu_workload_info", **labels)


def test_job_and_pod_owners_show_on_metrics_and_samples(tmp_path: Path) -> None:
    mapdir = tmp_path / "jobmap"
    mapdir.mkdir()
    kubelet = KubeletPodResources(tmp_path / "kubelet.sock").start()
    agent = AgentProcess(
        tmp_path, "--job-mapping-dir", str(mapdir), "--pod-resources-socket", str(kubelet.socket),
        "--workload-refresh-s", "0.5",
    ).start()
    try:
        uuids = {d.gpu: d.uuid for d in consumer.wait_for_info(agent.target).devices}
        kubelet.reply = kpb.ListPodResourcesResponse(pod_resources=[
            pod("ml-train", "llama-8b-worker-0", container("trainer", "nvidia.com/gpu", uuids[2]))
        ])
        slurm("prolog_slurmd", mapdir, "4242", "0,1")

        def labelled() -> bool:
            m = agent.metrics()
            return (info_series(m, gpu="0", hpc_job="4242", source="jobmap") == 1
                    and info_series(m, gpu="2", pod="llama-8b-worker-0", namespace="ml-train", container="trainer",
                                    source="podresources") == 1)

        assert wait_until(labelled, timeout_s=15), agent.metrics()
        m = agent.metrics()
        assert info_series(m) == 3  # GPUs 0 and 1 by job, GPU 2 by pod, GPU 3 by nobody
        assert metric_sum(m, "chopper_agent_workload_source_up", source="jobmap") == 1
        assert metric_sum(m, "chopper_agent_workload_source_up", source="podresources") == 1

        channel, stream = consumer.subscribe(agent.target, pb.SubscribeRequest(samples=True))
        jobs: dict[int, str] = {}
        try:
            for batch in stream:
                jobs.update({s.gpu: s.job for s in batch.samples})
                if len(jobs) == 4:
                    break
        finally:
            channel.close()
        assert jobs == {0: "4242", 1: "4242", 2: "", 3: ""}  # samples carry the Slurm job, not the pod

        slurm("epilog_slurmd", mapdir, "4242", "0,1")
        kubelet.stop()
        assert wait_until(lambda: info_series(agent.metrics(), source="jobmap") == 0, timeout_s=15)

        def kubelet_down() -> bool:
            m = agent.metrics()
            return (metric_sum(m, "chopper_agent_workload_source_up", source="podresources") == 0
                    and metric_sum(m, "chopper_agent_workload_errors_total", source="podresources",
                                   kind="unavailable") >= 1)

        assert wait_until(kubelet_down, timeout_s=20), agent.metrics()
        assert info_series(agent.metrics(), gpu="2", source="podresources") == 1  # last good reading kept
        assert agent.proc is not None and agent.proc.poll() is None
    finally:
        agent.terminate()
        kubelet.stop()
    assert "event=workload_source_down source=podresources" in agent.log()

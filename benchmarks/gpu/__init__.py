"""The GPU check (``make gpu-check``, docs/GPU_CHECK.md): agent, backend and a training loop on a real GPU.

``check`` runs it, ``workload`` is the training job, ``figures`` the MFUs and counters it reports,
``provenance`` what it writes beside the recorded run, ``wheels`` the packages it carries to a
machine without network.
"""

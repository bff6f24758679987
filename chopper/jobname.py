"""The one rule for job names, shared by the agent (markers) and the aggregator (step summaries).

A job name is one or more printable characters whose URI encoding is at most
``MAX_JOB_ENCODED_CHARS`` characters long. The bound comes from the aggregator's store, which
names a directory ``job=<URI-encoded job>`` and a directory name holds at most 255 bytes: without
it, one job with a long name fails every write of the store, for every job. That allows 251
letters, digits or ``-._~``, and fewer other characters (``/`` encodes to 3, a CJK character to 9).
"""
from __future__ import annotations

import urllib.parse

# 255 bytes of a file name, less the "job=" prefix of the partition directory.
MAX_JOB_ENCODED_CHARS = 255 - len("job=")


def job_name_problem(job: str) -> str | None:
    """Why ``job`` cannot name a job (a phrase for an error message), or None when it can."""
    if not job:
        return "the job name is empty"
    if not job.isprintable():
        return "the job name holds unprintable characters"
    encoded = len(urllib.parse.quote(job, safe=""))
    if encoded > MAX_JOB_ENCODED_CHARS:
        return (f"the job name is {encoded} characters URI-encoded, more than {MAX_JOB_ENCODED_CHARS} "
                "(about that many ASCII letters and digits, a third as many other characters)")
    return None

"""The rules for the names markers carry, shared by the client, the agent and the aggregator.

**Job names.** A job name is one or more printable characters whose URI encoding is at most
``MAX_JOB_ENCODED_CHARS`` characters long. The bound comes from the aggregator's store, which
names a directory ``job=<URI-encoded job>`` and a directory name holds at most 255 bytes: without
it, one job with a long name fails every write of the store, for every job. That allows 251
letters, digits or ``-._~``, and fewer other characters (``/`` encodes to 3, a CJK character to 9).

**Phase and collective names.** At most ``MAX_MARKER_NAME_CHARS`` printable characters.

Printable excludes control characters and Python's surrogate escapes, the form ``os.environ``
gives a byte that is not UTF-8 (``CHOPPER_JOB=$'caf\\xff'`` reads as ``'caf\\udcff'``), which no
protobuf string can hold. The client does not send what these rules refuse: ``usable_job_name``
and ``escape_unprintable`` turn such text into the nearest name they accept, so it can say what
it sends instead of losing every marker.
"""
from __future__ import annotations

import functools
import hashlib
import urllib.parse

from chopper.identity.launcher import DEFAULT_JOB

# 255 bytes of a file name, less the "job=" prefix of the partition directory.
MAX_JOB_ENCODED_CHARS = 255 - len("job=")
MAX_MARKER_NAME_CHARS = 256
# "~" and 12 hex digits of SHA-256 end a shortened job name, so that long names stay apart.
_DIGEST_CHARS = 12


# Cached: the aggregator asks for every summary and position it takes in, of a few job names.
@functools.lru_cache(maxsize=4096)
def job_name_problem(job: str) -> str | None:
    """Why ``job`` cannot name a job (a phrase for an error message), or None when it can."""
    if not job:
        return "the job name is empty"
    if not job.isprintable():
        return "the job name holds unprintable characters (or bytes that are not UTF-8)"
    encoded = _encoded_chars(job)
    if encoded > MAX_JOB_ENCODED_CHARS:
        return (f"the job name is {encoded} characters URI-encoded, more than {MAX_JOB_ENCODED_CHARS} "
                "(about that many ASCII letters and digits, a third as many other characters)")
    return None


def marker_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a phase or collective, or None when it can (an empty name is the caller's)."""
    if len(name) > MAX_MARKER_NAME_CHARS:
        return f"the name is {len(name)} characters long, more than {MAX_MARKER_NAME_CHARS}"
    if not name.isprintable():
        return "the name holds unprintable characters (or bytes that are not UTF-8)"
    return None


def escape_unprintable(text: str) -> str:
    """``text`` with each unprintable character written as an escape, so the result is printable.

    A byte that was not UTF-8 (a surrogate escape, U+DC80..U+DCFF) becomes ``\\xNN`` with that
    byte's value, so distinct bytes stay distinct; any other unprintable character becomes its
    Python escape (``\\n``, ``\\x00``, ``\\u200b``, ``\\ud800``).
    """
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable():
            out.append(c)
        elif "\udc80" <= c <= "\udcff":
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        else:
            out.append(c.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def usable_job_name(job: str) -> str:
    """``job`` if ``job_name_problem`` accepts it, else the nearest name it accepts.

    Empty is ``"default"``; unprintable characters are escaped (``escape_unprintable``); a name
    still too long keeps its longest prefix that fits with ``~`` and 12 hex digits of the
    SHA-256 of the whole original name, so two long names that share a prefix stay two jobs.
    """
    if job_name_problem(job) is None:
        return job
    if not job:
        return DEFAULT_JOB
    escaped = escape_unprintable(job)
    if _encoded_chars(escaped) <= MAX_JOB_ENCODED_CHARS:
        return escaped
    digest = hashlib.sha256(job.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_CHARS]
    room = MAX_JOB_ENCODED_CHARS - 1 - _DIGEST_CHARS
    end = used = 0
    while used + _encoded_chars(escaped[end]) <= room:  # stops inside: the whole name does not fit
        used += _encoded_chars(escaped[end])
        end += 1
    return f"{escaped[:end]}~{digest}"


def _encoded_chars(text: str) -> int:
    return len(urllib.parse.quote(text, safe=""))

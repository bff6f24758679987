"""GPU → job ownership from a mapping directory that the Slurm prolog writes.

The convention is dcgm-exporter's ``--hpc-job-mapping-dir``: one file per GPU, named by the GPU's
index (the agent's ``gpu`` label, which is the NVML / amdsmi index), holding the ids of the jobs
that own it, one per line. ``deploy/slurm/prolog.sh`` writes it (tmp file + rename, so a reader
never sees half a file) and ``deploy/slurm/epilog.sh`` removes the job again.

Reading, every refresh:

1. List the directory. Names that are not a decimal GPU index (the scripts' ``.tmp`` files, a
   lock directory) are skipped silently.
2. Read each file; blank lines and ``#`` comments are ignored, every other line is one job id.
3. A job id must be printable ASCII without spaces, at most ``MAX_JOB_ID`` characters. A file
   that breaks this is left out and reported (``JobMap.problems``) with its path and the fix; the
   other GPUs still count, so one bad file never hides every job.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# Slurm ids are numbers (``1234``, ``1234_7`` for array tasks, ``1234+1`` for het jobs); allow any
# label-safe token but keep a bound so a corrupt file cannot blow up every label it lands in.
MAX_JOB_ID = 128
_JOB_ID = re.compile(rf"[!-~]{{1,{MAX_JOB_ID}}}")
# A mapping file holds a few ids; anything much larger is not one of ours.
MAX_FILE_BYTES = 64 * 1024


class JobMapUnreadable(OSError):
    """The mapping directory itself cannot be listed; the message names it and the fix."""


@dataclass(frozen=True)
class JobMap:
    """One reading of the mapping directory.

    Attributes:
        jobs: Job ids by GPU index, in file order, duplicates removed.
        problems: One message per file left out, naming the file and what is wrong with it.
    """

    jobs: dict[int, tuple[str, ...]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


def parse_job_file(text: str) -> tuple[str, ...]:
    """The job ids in one mapping file's text.

    Raises:
        ValueError: A line is not a job id (names the line and what is accepted).
    """
    jobs: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not _JOB_ID.fullmatch(line):
            raise ValueError(
                f"line {number} {line[:40]!r} is not a job id (printable ASCII without spaces, "
                f"at most {MAX_JOB_ID} characters, one per line)"
            )
        if line not in jobs:
            jobs.append(line)
    return tuple(jobs)


def read_job_map(directory: Path) -> JobMap:
    """Read every GPU's mapping file in ``directory``.

    Raises:
        JobMapUnreadable: ``directory`` is missing or cannot be listed.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        raise JobMapUnreadable(
            f"job_mapping_dir {str(directory)!r} does not exist; create it (the Slurm prolog writes into it, "
            "see deploy/slurm/README.md) or unset job_mapping_dir"
        ) from None
    except OSError as exc:
        raise JobMapUnreadable(
            f"job_mapping_dir {str(directory)!r} cannot be listed: {exc.strerror}; the agent needs read and "
            "execute permission on it"
        ) from None
    jobs: dict[int, tuple[str, ...]] = {}
    problems: list[str] = []
    for name in sorted(names):
        if not name.isdecimal():
            continue
        path = directory / name
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise ValueError(f"is larger than {MAX_FILE_BYTES} bytes; a mapping file holds a few job ids")
            ids = parse_job_file(data.decode("ascii"))
        except FileNotFoundError:
            continue  # the epilog removed it between listing and reading: the GPU is free
        except IsADirectoryError:
            problems.append(f"{path}: is a directory; mapping entries are files named by GPU index")
            continue
        except UnicodeDecodeError:
            problems.append(f"{path}: is not ASCII text; write one job id per line")
            continue
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: {exc.strerror if isinstance(exc, OSError) else exc}")
            continue
        if ids:
            jobs[int(name)] = ids
    return JobMap(jobs, tuple(problems))

#!/bin/sh
# Chopper's Slurm prolog and epilog in one script: tells chopper-agent which job owns which GPUs, so
# its samples and /metrics carry the job id even when the training script is not instrumented.
#
# slurm.conf (both lines name this one file; Slurm says which one is running in SLURM_SCRIPT_CONTEXT):
#   Prolog=/etc/slurm/chopper-jobmap.sh
#   Epilog=/etc/slurm/chopper-jobmap.sh
# or put it (or a link to it) into existing prolog.d/ and epilog.d/ directories.
#
# What it writes is dcgm-exporter's --hpc-job-mapping-dir convention, which chopper-agent reads with
# --job-mapping-dir: in CHOPPER_JOB_MAPPING_DIR (default /run/chopper-jobmap) one file per GPU,
# named by the GPU index, holding the ids of the jobs on that GPU, one per line. Each file is
# replaced atomically (a temporary file, then mv) so the agent never reads half a file; a lock
# directory serialises jobs that share a GPU (shard/MPS gres, OverSubscribe).
#
# GPUs are taken from the first of SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES,
# GPU_DEVICE_ORDINAL that is set: slurmd gives Prolog and Epilog these as the node's GPU indices
# (with AutoDetect=nvml or =rsmi in gres.conf they are the NVML / amdsmi indices the agent uses).
#
# A prolog that fails drains the node, and telemetry must never stop a job: every problem is
# written to stderr (slurmd's log) and the script still exits 0.
#
# Usage outside Slurm (tests, manual repair): chopper-jobmap.sh add|remove, with SLURM_JOB_ID and
# one of the GPU variables set.

PATH=/usr/sbin:/usr/bin:/sbin:/bin   # Slurm runs prologs with no search path
umask 022                            # the agent may run as another user: files must be readable

dir=${CHOPPER_JOB_MAPPING_DIR:-/run/chopper-jobmap}
lock="$dir/.lock"
# The lock is held for milliseconds; a holder that died leaves it behind, so give up waiting
# after this many seconds and take it over rather than hold up the job.
lock_wait_s=${CHOPPER_JOBMAP_LOCK_WAIT_S:-10}

say() {
    echo "chopper-jobmap: $*" >&2
}

case "${1:-$SLURM_SCRIPT_CONTEXT}" in
    add | prolog_slurmd) action=add ;;
    remove | epilog_slurmd) action=remove ;;
    *)
        say "nothing to do for context '${1:-$SLURM_SCRIPT_CONTEXT}': install as Prolog= and Epilog= (slurmd), or pass add|remove"
        exit 0
        ;;
esac

job=${SLURM_JOB_ID:-$SLURM_JOBID}
case "$job" in
    '' | *[!0-9A-Za-z_+.-]*)
        say "SLURM_JOB_ID '${job}' is empty or not a job id; GPUs not mapped"
        exit 0
        ;;
esac

gpus=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-${ROCR_VISIBLE_DEVICES:-$GPU_DEVICE_ORDINAL}}}
[ -n "$gpus" ] || exit 0   # a job without GPUs on this node

if ! mkdir -p "$dir"; then
    say "cannot create $dir; job $job not mapped"
    exit 0
fi

tries=0
until mkdir "$lock" 2>/dev/null; do
    if [ "$tries" -ge $((lock_wait_s * 10)) ]; then
        say "lock $lock held for ${lock_wait_s}s (a crashed run?); taking it over"
        break
    fi
    # POSIX sleep takes whole seconds; GNU and busybox take 0.1, which keeps shared-GPU starts quick.
    sleep 0.1 2>/dev/null || sleep 1
    tries=$((tries + 1))
done
trap 'rmdir "$lock" 2>/dev/null' EXIT

# Rewrites one GPU's file without $job, then (for add) with $job appended; an empty file is removed.
update() {
    file="$dir/$1"
    tmp="$dir/.$1.$$"
    {
        [ -f "$file" ] && grep -v -x -F -e "$job" "$file"
        [ "$action" = add ] && echo "$job"
    } >"$tmp"
    if [ -s "$tmp" ]; then
        mv -f "$tmp" "$file" || say "cannot replace $file"
    else
        rm -f "$tmp" "$file"
    fi
}

old_ifs=$IFS
IFS=,
for gpu in $gpus; do
    IFS=$old_ifs
    case "$gpu" in
        '' | *[!0-9]*) say "GPU '$gpu' in '$gpus' is not a GPU index; skipped (configure gres with AutoDetect)" ;;
        *) update "$gpu" ;;
    esac
done
exit 0

"""Disk, memory and checkpoints: a full disk, the OOM killer, a damaged or superseded checkpoint loaded, the loss
after a resume.

Registered, in order, by registry.py's DIAGNOSES."""

from __future__ import annotations

from sim.core.faultkinds import kind_of
from sim.core.history import DockerRecord, FaultRecord, Record, WorkerRecord
from sim.core.nodes import node_order
from sim.verdict.checkers import stale_writes
from sim.verdict.diagnoses.evidence import (
    Diagnosis,
    _at,
    _describe,
    _faults_where,
    _line,
    _tidy,
    result_of,
)
from sim.verdict.recovery import LOSS_JUMP_TOLERANCE, loss_across_resumes
from sim.verdict.runmodel import RunModel

# A worker that exits with SIGKILL this long after its node's Docker `oom` event was the OOM killer's
# victim (the agent notices within its monitor interval); the slack covers the two clocks' order.
OOM_EXIT_S = 30.0


OOM_CLOCK_SLACK_S = 1.0


def loss_jump(run: RunModel, tolerance: float = LOSS_JUMP_TOLERANCE) -> Diagnosis | None:
    """(d) The loss jumps after a restart (the loss_continuity checker's finding), or the
    optimizer's step count starts over: optimizer (or scheduler) state not restored."""
    evidence, resets = [], []
    jumps = [found for found in loss_across_resumes(run, tolerance) if found.jumped]
    for found in jumps:
        last = found.before[max(found.before)]
        evidence.append(
            _line(
                last,
                f"step {last.step} loss {last.loss:.4g} (mean {found.mean_before:.4g} over "
                f"{len(found.before)} step(s) before)",
            )
        )
        peak = max(found.after.values(), key=lambda r: r.loss)
        evidence.append(
            _line(
                peak,
                f"step {peak.step} loss {peak.loss:.4g} after the restart "
                f"(mean {found.mean_after:.4g} over {len(found.after)} step(s))",
            )
        )
    for resume in run.resumes:
        reset = _optimizer_reset(run, resume.t)
        if reset is not None:
            resets.append(reset)
            first, reached = reset
            evidence.append(
                _line(
                    first,
                    f"rank {first.rank}: optimizer state step {first.step} at its "
                    f"first step after the restart; it had reached {reached} before",
                )
            )
    if not jumps and not resets:
        return None
    parts = []
    if jumps:
        found = jumps[0]
        times = f" ({found.mean_after / found.mean_before:.1f}x)" if found.mean_before > 0 else ""
        parts.append(
            f"After the restart at {_at(found.resume.t)} the loss rose from {found.mean_before:.4g} to "
            f"{found.mean_after:.4g}{times}: the resumed run did not carry on the same training state."
        )
    if resets:
        parts.append(
            "The optimizer's own step count started over at 1 after the restart: its state (moments, "
            "step) was not loaded from the checkpoint, so it restarted from scratch on trained weights."
        )
    else:
        parts.append(
            "The usual cause is a checkpoint without the optimizer's (or the LR scheduler's) state: "
            "a fresh Adam takes full-size steps on trained weights, a fresh scheduler restarts warm-up."
        )
    return Diagnosis(
        "loss-jump",
        "Loss jumps after a restart: optimizer or scheduler state not restored",
        " ".join(parts),
        evidence,
        "Save optimizer.state_dict() (and the LR scheduler's and GradScaler's state_dict()) in the checkpoint with "
        "the model, and load them on every start; with torch.distributed.checkpoint, save and load "
        "get_state_dict(model, optimizer).",
    )


def _optimizer_reset(run: RunModel, restart: float) -> tuple[WorkerRecord, int] | None:
    """A worker whose optimizer-held step counts from 1 again after `restart`, though it had gone further."""
    steps = [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "step" and r.step is not None]
    reached = max((r.step for r in steps if r.t < restart), default=None)
    after = [r for r in steps if r.t > restart and r.n is not None]
    if reached is None or not after:
        return None
    first = after[0]
    if first.step == first.n and reached > first.step:
        return first, reached
    return None


def disk_full(run: RunModel) -> Diagnosis | None:
    """(i) A write failed with ENOSPC (`Errno 28`): the checkpoint disk is full."""
    full = [r for r in run.agent_events("worker_error") if r.kind == "disk_full"]
    if not full:
        return None
    fills = [r for r in _faults_where(run, lambda kind: kind.fills_disk) if r.t <= full[-1].t]
    failed = run.agent_events("worker_failed")
    evidence = [_line(r, f"fault fill-disk: {_filled(r)}") for r in fills[-2:]]
    for error in full:
        evidence.append(_line(error))
        evidence += [_line(r) for r in failed if r.node == error.node and r.t >= error.t][:1]
    nodes = ", ".join(sorted({r.node for r in full}, key=node_order))
    injected = " while the fill-disk fault had filled it" if fills else ""
    return Diagnosis(
        "disk-full",
        f"No space left on device: a write failed on {nodes}",
        f"A write on {nodes} failed with ENOSPC (OSError: [Errno 28] No space left on device){injected}, "
        f"{len(full)} time(s). The worker crashed on it, and torchrun restarted the group at the cost of a restart: "
        "as long as the disk stays full, every restarted group fails at its next checkpoint write, until the "
        "restarts run out.",
        evidence,
        "Free space on the checkpoint volume or give it more (`python -m sim up --ckpt-size`, in a scenario "
        "cluster.ckpt_size) and keep fewer checkpoints (delete all but the newest K after each good write). In the "
        "script, write each checkpoint to a temp file and os.replace it, remove the temp file when the write fails, "
        "and treat ENOSPC on a checkpoint as a warning (keep training, retry at the next interval; the last good "
        "checkpoint stays) instead of a crash that burns a restart.",
    )


def _filled(fault: FaultRecord) -> str:
    result = result_of(fault)
    written = result.written
    size = f" of {written >> 20} MiB" if written is not None else ""
    return f"filler file {result.file or '?'}{size} written, the disk full"


def oom_kill(run: RunModel) -> Diagnosis | None:
    """(j) The kernel's OOM killer killed a worker: a Docker `oom` event on its node, then its
    exit by SIGKILL (or the node's container dying with 137: its main process, the agent, killed)."""
    killed = []
    for oom in (r for r in run.docker if r.action == "oom"):

        def soon_after(record: Record, oom: DockerRecord = oom) -> bool:
            return record.node == oom.node and -OOM_CLOCK_SLACK_S <= record.t - oom.t <= OOM_EXIT_S

        workers = [r for r in run.agent_events("worker_failed") if r.exitcode == -9 and soon_after(r)]
        nodes = [r for r in run.docker if r.action == "die" and r.exit_code == 137 and soon_after(r)]
        if workers or nodes:
            killed.append((oom, workers[:1] + nodes[:1]))
    if not killed:
        return None
    evidence, limits, injected = [], [], False
    for oom, exits in killed:
        # The oom-worker fault that caused it: its ok record follows the kill on the same node.
        fault = next(
            (
                r
                for r in _faults_where(run, lambda kind: kind.ooms_worker)
                if r.where == oom.node and abs(r.t - oom.t) <= OOM_EXIT_S
            ),
            None,
        )
        lines = [(oom, "Docker event oom: the kernel's OOM killer killed a process in the container")]
        lines += [(r, f"{_describe(r)}: SIGKILL from the OOM killer") for r in exits]
        if fault is not None:
            injected = True
            limit = result_of(fault).limit
            if limit is not None:
                limits.append(f"{limit >> 20} MiB on {oom.node}")
                lines.append((fault, f"fault oom-worker: memory limit {limit >> 20} MiB, then memory pressure"))
        evidence += [_line(r, text) for r, text in sorted(lines, key=lambda line: line[0].t)]
    nodes = ", ".join(sorted({oom.node for oom, _ in killed}, key=node_order))
    limit_words = f" (limit {', '.join(limits)})" if limits else ""
    how = " The oom-worker fault caused it on purpose." if injected else ""
    return Diagnosis(
        "oom-kill",
        f"Out of memory: the kernel's OOM killer killed a worker on {nodes}",
        f"The memory cgroup of {nodes} reached its limit{limit_words} and the kernel's OOM killer killed a worker "
        "with SIGKILL (exit code -9, no Python traceback). torchrun saw a failed worker and restarted the group, "
        f"at the cost of one restart; unless the memory use changes, it happens again.{how}",
        evidence,
        "Give the node more memory (`python -m sim up --memory`; on a real cluster, the pod's or job's memory limit) "
        "or use less: a smaller batch, fewer DataLoader workers, no tensors kept across steps (log loss.item(), "
        "not loss). If the worker's memory grows step after step, look for a leak.",
    )


def damaged_checkpoint_loaded(run: RunModel) -> Diagnosis | None:
    """(k) After a checkpoint was damaged on purpose, the script's torch.load fails on it: it loads
    the newest checkpoint blindly, with no checksum and no fallback."""
    damage = _faults_where(run, lambda kind: kind.damages_checkpoint)
    if not damage:
        return None
    unreadable = [
        r for r in run.agent_events("worker_error") if r.kind == "checkpoint_unreadable" and r.t > damage[0].t
    ]
    if not unreadable:
        return None
    before = [r for r in damage if r.t <= unreadable[0].t] or damage[:1]
    evidence = [_line(r, _damage_words(r)) for r in before[-2:]]
    evidence += [_line(r) for r in unreadable]
    evidence += [_line(r) for r in run.agent_events("error_file")[:1]]
    nodes = ", ".join(sorted({r.node for r in unreadable}, key=node_order))
    file = result_of(before[-1]).file
    return Diagnosis(
        "damaged-checkpoint-loaded",
        f"The script loads a damaged checkpoint blindly ({nodes})",
        f"After the checkpoint{f' {file}' if file else ''} was damaged, the script's torch.load failed on it on "
        f"{nodes} ({_tidy(unreadable[0].message or '')}), {len(unreadable)} time(s): it loads the newest checkpoint "
        "with no check and nothing to fall back to, so every restarted group crashes the same way until the "
        "restarts run out. (Flipped bits inside a tensor's data load without any error: that damage goes unseen.)",
        evidence,
        "Write checkpoints atomically: save to a temp file in the same directory, flush and fsync it, then "
        "os.replace it onto the final name, so a crash mid-write never leaves a partial checkpoint. Keep the previous "
        "checkpoints (step-numbered names, keep the last K), store a checksum (sha256) with each, verify it before "
        "loading, and fall back to the previous good one when it fails (trainer/train.py does all of this).",
    )


def _damage_words(fault: FaultRecord) -> str:
    result = result_of(fault)
    if kind_of(fault.fault).strikes_in_write:
        pid = "?" if result.pid is None else result.pid
        return f"fault kill-during-checkpoint: pid {pid} killed while it wrote {result.file}"
    return f"fault corrupt-checkpoint: {result.file} damaged ({result.mode or '?'})"


def superseded_round_checkpoint(run: RunModel) -> Diagnosis | None:
    """(n) A worker of a superseded round (its node frozen while the others regrouped) wrote a checkpoint
    after waking, over the newer round's, or one a later resume loaded: split brain on the checkpoint."""
    lost = [s for s in stale_writes(run) if s.lost]
    if not lost:
        return None
    evidence = []
    for stale in lost:
        w = stale.write
        evidence.append(_line(w, f"rank {w.rank} (world {w.world_size}, a superseded round) wrote {w.path}"))
        if stale.replaced is not None:
            evidence.append(_line(stale.replaced, f"the newer round's rank {stale.replaced.rank} had written it"))
        if stale.loaded_by is not None:
            evidence.append(_line(stale.loaded_by, f"rank {stale.loaded_by.rank} resumed from it"))
    frozen = _faults_where(run, lambda kind: kind.freezes_node)
    evidence += [_line(r, f"fault {r.fault} froze {r.where}") for r in frozen[:2]]
    nodes = ", ".join(sorted({s.write.node for s in lost}, key=node_order))
    return Diagnosis(
        "superseded-round-checkpoint",
        f"A checkpoint from a superseded round replaced newer state ({nodes})",
        f"{lost[0].describe()}. Its node was frozen (or cut off) while the others regrouped without it and trained "
        "on; woken, its old worker ran on for a moment before its agent noticed, and finished its save. Nothing in "
        "the script ties a checkpoint to the round that wrote it, so the superseded round's state took the place of "
        "the newer one, silently.",
        evidence,
        "Tie each checkpoint to the round that writes it. Write step-numbered (or round-tagged) files and resume "
        "from the newest, so a late write never replaces a newer one (trainer/train.py does this); write to a temp "
        "file and rename it onto its final name only while still in the current round (a collective with a short "
        "timeout, e.g. dist.monitored_barrier, just before the rename fails in a superseded one); or check before "
        "saving that the step is newer than the newest checkpoint on disk, and skip the save when it is not.",
    )

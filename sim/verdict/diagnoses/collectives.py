"""The process group: a timeout or a dead NCCL peer in a collective, a peer lost during init_process_group,
workers stuck at exit.

Registered, in order, by registry.py's DIAGNOSES."""

from __future__ import annotations

import itertools
import re

from sim.core.faultkinds import kind_of
from sim.core.history import AgentRecord, DockerRecord, FaultRecord, Record, WorkerRecord
from sim.core.nodes import node_order
from sim.verdict.diagnoses.evidence import (
    FROZEN_HANG_S,
    Diagnosis,
    _agent_nodes,
    _at,
    _describe,
    _faults_where,
    _first_per_node,
    _frozen_node,
    _line,
)
from sim.verdict.runmodel import AGENT_CONTAINER, RunModel

# A worker silent this long after a peer of its group finished the script (exit 0) is stuck at its end.
STUCK_AT_EXIT_S = 60.0


# torch's default NCCL process-group timeout (kProcessGroupNCCLDefaultTimeout, ProcessGroupNCCL.hpp, torch 2.13);
# images/node/elastic_sim_devices.py holds it too (a unit test keeps them equal).
NCCL_DEFAULT_TIMEOUT_S = 600.0


NCCL_TIMEOUT_TRADE_OFF = (
    "The trade-off: too short kills collectives that are slow for good reasons (a checkpoint save, a long first "
    "compile or data load, a straggler); too long wastes the whole timeout each time a node is lost. Choose it "
    "above the slowest healthy collective (under emulation, --failure-timing gloo shows the run without the wait)."
)
NCCL_DEAD_PEER_FIX = (
    "Pass timeout= to init_process_group to bound it, e.g. "
    f'dist.init_process_group("nccl", timeout=timedelta(seconds=120)). {NCCL_TIMEOUT_TRADE_OFF}'
)


def _nccl_dead_peer_fix(given: float | None) -> str:
    """The fix, true for the script: it may give init_process_group a timeout already."""
    if given is None:
        return NCCL_DEAD_PEER_FIX
    return (
        f"The script gives init_process_group timeout={given:g} s: each lost peer costs that long before the "
        f"watchdog lets torchrun regroup. A lower timeout= shortens it. {NCCL_TIMEOUT_TRADE_OFF}"
    )


def process_group_timeout(run: RunModel) -> Diagnosis | None:
    """(e) Workers hang in a collective until the process group's timeout after a peer froze. The advice
    follows the timeout the script gave init_process_group (its "pg_ready" records): none, one that let the
    others go, or one that did not bound the wait (the collective was in a group of its own timeout)."""
    timeouts = [r for r in run.agent_events("worker_error") if r.kind == "timeout"]
    frozen = _frozen_stalls(run)
    if not timeouts and not frozen:
        return None
    if not frozen and nccl_dead_peer(run) is not None:
        return None  # NCCL's watchdog after a peer died, not a frozen peer: nccl-dead-peer says it
    evidence = [
        _line(
            pause,
            f"{_frozen_node(pause)} stopped answering ({_describe(pause)}); no training "
            f"progress on any node for {quiet:.0f} s after it",
        )
        for pause, quiet in frozen
    ]
    evidence += [_line(r) for r in _first_per_node(timeouts)]
    waited = [int(m.group(1)) for r in timeouts if (m := re.search(r"waiting (\d+)ms", r.message or ""))]
    limit = ""
    if waited:
        longest_s = max(waited) / 1000
        limit = f" after waiting {f'{longest_s / 60:.0f} min' if longest_s >= 60 else f'{longest_s:.0f} s'}"
    first = min([p.t for p, _ in frozen] + [r.t for r in timeouts])
    given = _timeout_given(run, first)
    if given is None:
        cause = (
            "A peer stopped answering (frozen, stopped or cut off) while the others were inside a collective. "
            "They wait for it until the process group's timeout (30 minutes by default for gloo): its agent "
            "still looks alive to torchrun, so nothing restarts the group meanwhile."
        )
        fix = (
            "Pass a timeout to init_process_group that suits the job, e.g. "
            'dist.init_process_group("gloo", timeout=timedelta(seconds=60)): the blocked collective then fails, '
            "the worker exits and torchrun regroups without the frozen node."
        )
    else:
        pg_ready = max((r for r in _pg_ready(run) if r.t <= first), key=lambda r: r.t)
        evidence.append(_line(pg_ready, f"the script's process group: init_process_group(timeout={given:g} s)"))
        past = _held_past(run, frozen, given)
        if past is None:
            released = _released(run, first)
            cause = "A peer stopped answering (frozen, stopped or cut off) while the others were inside a collective. "
            if released is not None:
                evidence.append(_line(released))
                cause += (
                    f"They waited for it until the process group's timeout, the {_span(given)} the script gives "
                    f"init_process_group; then their collective failed ({_describe(released)} on {released.node}) "
                    "and torchrun restarted the group: the rest of the silence was that restart."
                )
            else:
                cause += (
                    f"They wait for it until the process group's timeout, the {_span(given)} the script gives "
                    "init_process_group: its agent still looks alive to torchrun, so nothing restarts the group "
                    "meanwhile."
                )
            fix = (
                f"The script's timeout ({_span(given)}) bounds the wait, as designed: each hung peer costs that long "
                "plus the restart. A lower timeout= shortens it; keep it above the slowest healthy collective "
                "(a checkpoint save, a first compile or data load, a straggler)."
            )
        else:
            held, until = past
            cause = (
                f"A peer stopped answering while the others were inside a collective, and they were held {held:.0f} s "
                f"{'without failing' if until is None else 'before their collective failed'}, although the script "
                f"gives init_process_group timeout={given:g} s: the "
                "collective that holds them is in a process group of its own, whose timeout is not init's. Groups "
                "made with new_group() or new_subgroups() without timeout=, and the sub-groups of a DeviceMesh of "
                "two or more dimensions (init_device_mesh), take torch's default "
                "(torch.distributed.constants: 30 minutes for gloo, 10 for NCCL). Their agents see live workers, "
                "so nothing restarts the group meanwhile."
            )
            fix = (
                f"Give that group the timeout too: dist.new_group(ranks, timeout=timedelta(seconds={given:g})) for "
                "each group the script makes; for a DeviceMesh's sub-groups, init_device_mesh(..., "
                "backend_override={dim: options}) with the backend options' _timeout set. A 1-D mesh over the "
                "whole world reuses the default group and its timeout."
            )
    if timeouts:
        cause += f" The collective timed out{limit} on {', '.join(sorted({r.node for r in timeouts}))}."
    return Diagnosis(
        "process-group-timeout", "Hang in a collective until the process group's timeout", cause, evidence, fix
    )


def _span(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 120 and seconds % 60 == 0 else f"{seconds:g} s"


def _pg_ready(run: RunModel) -> list[WorkerRecord]:
    return [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "pg_ready"]


def _timeout_given(run: RunModel, t: float) -> float | None:
    """The timeout= the script gave init_process_group in the last process group made by t (the node image
    records it in "pg_ready"); None: none given (torch's default), or an image that did not record it."""
    ready = [r for r in _pg_ready(run) if r.t <= t]
    if not ready:
        return None
    last = max(r.t for r in ready)
    given = [r.timeout_s for r in ready if r.t >= last - 60.0 and r.timeout_s is not None]
    return max(given) if given else None


def _released(run: RunModel, t: float) -> Record | None:
    """The first sign after t that a held collective let its workers go: a worker failed (its collective
    timed out), or NCCL's watchdog (emulated) took one down."""
    signs = [r for r in run.agent_events("worker_failed", "group_failed") if r.t > t]
    signs += [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "nccl_watchdog" and r.t > t]
    return min(signs, key=lambda r: r.t, default=None)


def _held_past(run: RunModel, frozen: list, given: float) -> tuple[float, Record | None] | None:
    """How long the others were held after a freeze, and what let them go (None: nothing), when that is well
    past the script's timeout (FROZEN_HANG_S beyond it: the others may finish a step first); None otherwise."""
    for pause, quiet in frozen:
        released = _released(run, pause.t)
        held = (released.t if released is not None else pause.t + quiet) - pause.t
        if held > given + FROZEN_HANG_S and quiet > given + FROZEN_HANG_S:
            return held, released
    return None


def nccl_dead_peer(run: RunModel) -> Diagnosis | None:
    """Survivors blocked in a collective until the process group's timeout after a peer died: NCCL's
    failure timing (real, or emulated on CPU by images/node/elastic_sim_devices.py, whose "nccl_watchdog"
    record each such worker writes before it aborts as ProcessGroupNCCL's watchdog does)."""
    held = [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "nccl_watchdog"]
    if not held:
        return _nccl_watchdog_logged(run)
    first = min(held, key=lambda r: r.t)
    began = first.began if first.began is not None else first.t - (first.seconds or 0.0)
    losses = [f for f in _faults_where(run, lambda kind: kind.loses_node or kind.ends_workers) if f.t <= began + 5.0]
    loss = losses[-1] if losses else None
    if loss is None and any(f.t <= began + 5.0 for f in _faults_where(run, lambda kind: kind.stalls_workers)):
        return None  # a peer frozen, not dead: process-group-timeout tells that story
    timeouts = sorted({r.timeout_s for r in held if r.timeout_s is not None})
    timeout = timeouts[-1] if timeouts else None
    waited = f"{timeout:g} s" if timeout is not None else "the process group's timeout"
    evidence = [_line(loss, f"{_describe(loss)}: a peer of the job gone")] if loss else []
    evidence += [
        _line(
            r,
            f"rank {r.rank} blocked in {r.op or 'a collective'} for {r.seconds or 0:.1f} s "
            f"(timeout {r.timeout_s:g} s), then aborted by the watchdog (SIGABRT)",
        )
        for r in _first_per_node(held)
    ]
    default = " (torch's default for NCCL: 10 minutes)" if timeout == NCCL_DEFAULT_TIMEOUT_S else ""
    return Diagnosis(
        "nccl-dead-peer",
        f"Survivors blocked {waited} in a collective after a peer died",
        "A peer process died while the others were inside a collective. NCCL does not notice a dead peer: "
        f"the collective blocks until the process group's timeout ({waited}{default}), then ProcessGroupNCCL's "
        "watchdog aborts the process and only then does torchrun regroup. The whole timeout is lost per node "
        f"loss, on {', '.join(sorted({r.node for r in held if r.node}, key=node_order))}.",
        evidence,
        # Under emulation the watchdog's timeout is the script's when it gave one, else NCCL's default.
        _nccl_dead_peer_fix(_timeout_given(run, began) or (timeout if timeout != NCCL_DEFAULT_TIMEOUT_S else None)),
    )


def _nccl_watchdog_logged(run: RunModel) -> Diagnosis | None:
    """A real NCCL run (no emulation records): the watchdog's own lines after a peer's node or process died."""
    words = "Watchdog caught collective operation timeout"
    logged = [r for r in run.agent_events("worker_error") if words in (r.message or "")]
    lost = _faults_where(run, lambda kind: kind.loses_node or kind.ends_workers)
    if not logged or not lost or lost[0].t > logged[0].t:
        return None
    ran = [int(m.group(1)) for r in logged if (m := re.search(r"ran for (\d+) milliseconds", r.message or ""))]
    waited = f"{max(ran) / 1000:.0f} s" if ran else "the process group's timeout"
    return Diagnosis(
        "nccl-dead-peer",
        f"Survivors blocked {waited} in a collective after a peer died",
        "A peer process died while the others were inside a collective. NCCL does not notice a dead peer: "
        "the collective blocks until the process group's timeout, then ProcessGroupNCCL's watchdog aborts the "
        "process and only then does torchrun regroup.",
        [_line(lost[-1] if lost[-1].t <= logged[0].t else lost[0]), *(_line(r) for r in _first_per_node(logged))],
        _nccl_dead_peer_fix(_timeout_given(run, logged[0].t)),
    )


def _frozen_stalls(run: RunModel) -> list[tuple[FaultRecord | DockerRecord, float]]:
    """Pauses (of a node, of a worker, of a worker's collectives) after which no worker anywhere
    showed progress for longer than FROZEN_HANG_S."""
    beats = run.beat_times
    if not beats:
        return []  # nothing measures progress for this script: no claim
    stalls = []
    pauses = _faults_where(run, lambda kind: kind.stalls_workers) or [r for r in run.docker if r.action == "pause"]
    for pause in pauses:
        target = _frozen_node(pause)
        resumed = [
            r.t
            for r in run.records
            if r.t > pause.t
            and (
                (isinstance(r, FaultRecord) and kind_of(r.fault).resumes_workers and r.target == target)
                or (isinstance(r, DockerRecord) and r.action == "unpause" and r.node == target)
            )
        ]
        until = min(resumed, default=run.t_end)
        # The longest silence while it was in force: peers may finish a step or two before they block.
        times = [pause.t, *(t for t in beats if pause.t < t < until), until]
        quiet = max(b - a for a, b in itertools.pairwise(times))
        if quiet > FROZEN_HANG_S:
            stalls.append((pause, quiet))
    return stalls


def stuck_at_exit(run: RunModel) -> Diagnosis | None:
    """(o) A worker never ends after a peer of its group ran the script to its end (exit 0)."""
    workers = [r for r in run.records if isinstance(r, WorkerRecord)]
    exits = {(r.node, r.pid): r for r in workers if r.event == "exit"}
    finished = sorted((r for r in exits.values() if r.code == 0), key=lambda r: r.t)
    if not finished:
        return None
    done = finished[0]
    starts = {(r.node, r.pid): r for r in workers if r.event == "start"}
    if (done.node, done.pid) not in starts:
        return None
    cohort = run.cohort_index(starts[done.node, done.pid].t)
    last_seen = {(r.node, r.pid): r for r in workers}  # sorted by time: the last record wins
    removed = run.removed_on_purpose()
    stuck = []
    for key, start in starts.items():
        node = start.node
        if key in exits or node in removed or run.cohort_index(start.t) != cohort:
            continue
        last = last_seen[key]
        agent_news = [r for r in run.agent if r.node == node and r.t > last.t]
        if not agent_news and run.t_end - max(last.t, done.t) >= STUCK_AT_EXIT_S:
            stuck.append(last)
    if not stuck:
        return None
    waiting = [r for r in run.agent_events("group_finished") if r.t >= done.t]
    names = ", ".join(f"rank {r.rank} on {r.node}" for r in stuck)
    return Diagnosis(
        "stuck-at-exit",
        f"A worker never ended after its peers finished the script: {names}",
        f"Rank {done.rank} on {done.node} ran the script to its end and exited 0 at {_at(done.t)}; {names} "
        f"never exited (silent for {run.t_end - max(r.t for r in stuck):.0f} s, up to the end of the run), so "
        "its agent waits for it and the finished agents wait in torch's exit barrier. A known cause is a "
        "teardown deadlock in torch 2.13's gloo process group: when its last reference goes (DDP's reducer "
        "freed as main() returns, or dist.destroy_process_group()), its destructor joins the group's worker "
        "thread while holding the GIL, and that thread, still releasing the final collective's tensors, waits "
        "for the GIL (pytorch/pytorch#75097).",
        [_line(done, f"rank {done.rank} exited 0")]
        + [_line(r, f"rank {r.rank}: last sign of life ({r.event}); no exit after it") for r in stuck]
        + [_line(r, "worker group finished; waiting for the other agents") for r in waiting],
        "Give the group's threads a moment after the final collective, before the group goes: time.sleep(1) "
        "(it releases the GIL) before dist.destroy_process_group(), then delete the DDP model and optimizer "
        "while the script still runs. A dist.barrier() alone does not help: its work holds the earlier ones. "
        "If a worker can still hang at exit, end it with os._exit(0) once its output is flushed.",
    )


# Survivors held inside init_process_group this long after a peer's loss: torch's init does not notice it.
INIT_HELD_S = 60.0


# torch 2.13's init_process_group default timeout (torch/distributed/constants.py, default_pg_timeout), which
# bounds the rendezvous store's waits in init; NCCL's own default (default_pg_nccl_timeout) is 10 minutes.
INIT_DEFAULT_TIMEOUT_S = 1800


WAITED_MS = re.compile(r"(?:timeout after|waiting|Timed out after) (\d+)\s?(ms|seconds)")


def init_peer_lost(run: RunModel) -> Diagnosis | None:
    """(r) A node lost while its round's workers were still inside init_process_group: the others wait for it
    in the store (and gloo's connection set-up) until init's timeout, and nothing regroups meanwhile."""
    losses = [f for f in _faults_where(run, lambda kind: kind.loses_node) if f.where]
    losses += [
        r
        for r in run.docker
        if r.action in ("die", "kill") and AGENT_CONTAINER.match(str(r.node))
        and not any(f.where == r.node and abs(f.t - r.t) < 5.0 for f in losses)
    ]  # fmt: skip
    for loss in sorted(losses, key=lambda r: r.t):
        lost = _frozen_node(loss) if isinstance(loss, FaultRecord) and kind_of(loss.fault).freezes_node else (
            loss.where if isinstance(loss, FaultRecord) else loss.node
        )  # fmt: skip
        held = [h for node in _agent_nodes(run) if node != lost and (h := _held_in_init(run, node, loss.t))]
        if held and _in_init(run, lost, loss.t) is not None:
            return _init_peer_lost(run, loss, lost, held)
    return None


def _in_init(run: RunModel, node: str, t: float) -> float | None:
    """When the node's worker group in force at t started, if its workers had not come out of
    init_process_group by t (no "pg_ready", no step or collective anywhere since); else None."""
    started = [r.t for r in run.agent_events("group_started", node=node) if r.t <= t]
    if not started:
        return None
    since = started[-1]
    workers = [r for r in run.records if isinstance(r, WorkerRecord) and r.node == node and since <= r.t <= t]
    if any(r.event == "pg_ready" for r in workers) or any(since < b <= t for b in run.beat_times):
        return None
    return since


def _held_in_init(run: RunModel, node: str, t_loss: float) -> tuple | None:
    """(node, its group's start, how it ended, until when, the error it ended with) for a node held in init
    past INIT_HELD_S after the loss; None otherwise."""
    since = _in_init(run, node, t_loss)
    if since is None:
        return None
    later = [
        r
        for r in run.records
        if r.t > t_loss
        and getattr(r, "node", None) == node
        and (
            (isinstance(r, WorkerRecord) and r.event == "pg_ready")
            or (isinstance(r, AgentRecord) and r.event in ("worker_failed", "group_started", "group_failed"))
        )
    ]
    beats = [b for b in run.beat_times if b > t_loss]
    ends = [(r.t, r) for r in later] + [(b, None) for b in beats[:1]]
    until, ended = min(ends, key=lambda e: e[0], default=(run.t_end, None))
    errors = [
        r
        for r in run.agent_events("worker_error", "worker_exception", node=node)
        if t_loss < r.t <= until + 2.0 and WAITED_MS.search(r.message or "")
    ]
    # Held long, or (with a timeout given) until init's own wait timed out.
    if until - t_loss <= INIT_HELD_S and not (errors and isinstance(ended, AgentRecord)):
        return None
    return node, since, ended, until, errors[0] if errors else None


def _init_peer_lost(run: RunModel, loss: Record, lost: str, held: list[tuple]) -> Diagnosis:
    nodes = ", ".join(h[0] for h in held)
    longest = max(h[3] for h in held) - loss.t
    failed = [h for h in held if isinstance(h[2], AgentRecord)]
    waited, seconds = "", None
    for h in held:
        if h[4] is not None and (m := WAITED_MS.search(h[4].message or "")):
            seconds = int(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
            waited = f" (the error: a wait of {seconds:g} s, init's timeout)"
            break
    their = "its" if len(held) == 1 else "their"
    if failed:
        outcome = f"then {their} workers failed{waited} and torchrun regrouped without {lost}"
    else:
        outcome = (
            f"up to the end of the run, and would have until init's timeout (30 minutes by default for gloo) "
            f"before regrouping without {lost}"
        )
    evidence = [_line(loss, f"{_describe(loss)}: {lost} lost while its workers were in init_process_group")]
    for node, since, ended, until, error in held:
        evidence.append(
            f"{node} {_at(since)}  worker group started; no process group (pg_ready), step or collective after it"
        )
        if error is not None:
            evidence.append(_line(error))
        evidence.append(
            f"{node} {_at(until)}  "
            + (
                f"{_describe(ended)}, {until - loss.t:.0f} s after the loss"
                if ended is not None
                else f"still waiting at the end of the run, {until - loss.t:.0f} s after the loss"
            )
        )
    return Diagnosis(
        "init-peer-lost",
        f"A peer lost during process-group set-up held {nodes} in init_process_group for {longest:.0f} s",
        f"{lost} was lost at {_at(loss.t)} while the round's workers were still inside init_process_group (started, "
        f"no process group yet). torch's init cannot tell a lost peer from a slow one: the others wait for it in "
        f"the rendezvous store (and gloo's connection set-up) until init_process_group's timeout, "
        f"{INIT_DEFAULT_TIMEOUT_S // 60} minutes by default for gloo (torch.distributed.constants.default_pg_timeout; "
        "10 minutes for NCCL). Their agents see live workers, so nothing regroups meanwhile. "
        f"{nodes} {'was' if len(held) == 1 else 'were'} held {longest:.0f} s, {outcome}.",
        evidence,
        (
            f"The script gives init a timeout ({seconds:g} s): the hold cost that long, then torchrun regrouped, as "
            "designed. A lower timeout= shortens it; "
            if seconds is not None and seconds < INIT_DEFAULT_TIMEOUT_S
            else "Pass a timeout to init_process_group: "
            "dist.init_process_group(backend, timeout=timedelta(seconds=60)): "
        )
        + "it bounds init's waits, so a peer lost during set-up costs that long before the worker fails and torchrun "
        "regroups; it also bounds every later collective, so keep it above the slowest step, checkpoint save or "
        "barrier. No torchrun option or environment variable changes init's default. In a fault test, fault the "
        "job once it trains (`sim up --detach` returns when the worker groups start, before init is done).",
    )

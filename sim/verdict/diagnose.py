"""Diagnoses: known causes of a failing or troubled run, named with their evidence and fix.

A diagnosis is a pure function of a run, like a checker: the history records (as in
sim/verdict/__init__.py) and each node's container log text (`docker logs --timestamps` form, as saved
in runs/NAME-RUNID/logs/; plain text without timestamps works too) go in, and out comes the
cause, the evidence (records or log lines, each with its node and time) and the fix in plain
words, or nothing. Each one is unit-tested on logs captured from real torchrun 2.13 runs
(tests/data/logs/).

Where a node's log is given, its agent and trainer records are read from the log (the whole
story, with the lines the collector may not have reached); otherwise from the history.
Everything else (the run's spec, faults, Docker events, worker side-channel records) comes
from the history.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone

from sim.core.agentlog import NodeLogParser, parse_docker_timestamp, worker_error_kind
from sim.core.faultkinds import kind_of, names_where
from sim.core.history import AgentRecord, DockerRecord, FaultRecord, Record, RunRecord, TrainerRecord, WorkerRecord
from sim.core.nodes import node_order
from sim.verdict.checkers import stale_writes
from sim.verdict.pitfalls import PITFALLS, Finding
from sim.verdict.recovery import LOSS_JUMP_TOLERANCE, loss_across_resumes
from sim.verdict.runmodel import AGENT_CONTAINER, RunModel

MAX_EVIDENCE = 8
MAX_EVIDENCE_CHARS = 300
# The store-sharing opt-out torch 2.13 reads in the agent (dynamic_rendezvous.py).
STORE_OPT_OUT = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# No sign of training for this long while a node is frozen: the others are stuck in a collective.
FROZEN_HANG_S = 60.0
# A worker silent this long after a peer of its group finished the script (exit 0) is stuck at its end.
STUCK_AT_EXIT_S = 60.0
# An agent whose etcd call failed and that exited within this long ended on it (etcd-lost).
ETCD_LOSS_EXIT_S = 15.0
# rendezvous-etcd-v3's words when it gives up on etcd: "(unreachable for 30 s, reconnect_timeout=30)".
RECONNECT_TIMEOUT = re.compile(r"reconnect_timeout=(\d+(?:\.\d+)?)")
# An agent in a rendezvous this long without completing it is waiting for nodes.
RDZV_WAIT_S = 60.0
# What an agent reports about its workers after starting them: anything but silence.
AGENT_NEWS = (
    "group_started",
    "worker_failed",
    "group_failed",
    "group_finished",
    "worker_error",
    "new_nodes",
    "rdzv_closed",
    "rdzv_error",
    "error_file",
)
# A worker that exits with SIGKILL this long after its node's Docker `oom` event was the OOM killer's
# victim (the agent notices within its monitor interval); the slack covers the two clocks' order.
OOM_EXIT_S = 30.0
OOM_CLOCK_SLACK_S = 1.0
# torch's default NCCL process-group timeout (kProcessGroupNCCLDefaultTimeout, ProcessGroupNCCL.hpp, torch 2.13);
# images/node/elastic_sim_devices.py holds it too (a unit test keeps them equal).
NCCL_DEFAULT_TIMEOUT_S = 600.0
NCCL_DEAD_PEER_FIX = (
    "Pass timeout= to init_process_group to bound it, e.g. "
    'dist.init_process_group("nccl", timeout=timedelta(seconds=120)). The trade-off: too short kills '
    "collectives that are slow for good reasons (a checkpoint save, a long first compile or data load, a "
    "straggler); too long wastes the whole timeout each time a node is lost. Choose it above the slowest "
    "healthy collective (under emulation, --failure-timing gloo shows the run without the wait)."
)
NODE_LOSS_DOCKER = ("die", "kill", "stop", "pause", "network_disconnect")


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    code: str  # stable short name, e.g. "shared-tcp-store"
    title: str
    cause: str
    evidence: tuple[str, ...]  # "node0 14:09:46.8  <line or record>"; the first MAX_EVIDENCE of those given
    fix: str

    def __post_init__(self):
        object.__setattr__(self, "evidence", tuple(self.evidence)[:MAX_EVIDENCE])


def diagnose(
    run: RunModel | Sequence[Mapping], logs: Mapping[str, str], loss_jump_tolerance: float = LOSS_JUMP_TOLERANCE
) -> list[Diagnosis]:
    """Every known cause the run shows, most fundamental first (the loss judged as the
    loss_continuity checker judges it, at the same tolerance)."""
    run = _with_logs(run if isinstance(run, RunModel) else RunModel(run), logs)
    found = (rule(run, loss_jump_tolerance) if rule is loss_jump else rule(run) for rule in DIAGNOSES)
    return [diagnosis for diagnosis in found if diagnosis is not None]


def format_diagnoses(diagnoses: Sequence[Diagnosis], width: int = 100) -> str:
    """The diagnoses as a terminal block; empty when there are none."""
    lines = []
    for number, found in enumerate(diagnoses, 1):
        lines.append(f"Diagnosis {number}/{len(diagnoses)} [{found.code}]: {found.title}")
        lines += _field("cause", found.cause, width)
        for index, item in enumerate(found.evidence):
            wrapped = textwrap.wrap(_clip(item, MAX_EVIDENCE_CHARS), width - 12, subsequent_indent="    ")
            lines += [f"  {'evidence:' if index == 0 and i == 0 else '':<10}{line}" for i, line in enumerate(wrapped)]
        lines += _field("fix", found.fix, width)
    return "\n".join(lines)


def _field(name: str, text: str, width: int) -> list[str]:
    wrapped = textwrap.wrap(text, width - 12) or [""]
    return [f"  {name + ':' if i == 0 else '':<10}{line}" for i, line in enumerate(wrapped)]


# --------------------------------------------------------------------------- the run, read once


def _with_logs(run: RunModel, logs: Mapping[str, str]) -> RunModel:
    """The run with each logged node's agent and trainer records read from its log instead."""
    if not logs:
        return run
    kept = [r for r in run.all_records if not (isinstance(r, (AgentRecord, TrainerRecord)) and r.node in logs)]
    return RunModel(
        [*kept, *(r for node, text in logs.items() for r in _log_records(node, text))], skipped_lines=run.skipped_lines
    )


def _agent_nodes(run: RunModel) -> list[str]:
    return sorted({r.node for r in run.agent if r.node}, key=node_order)


def _fault_records(run: RunModel, *kinds: str) -> list[FaultRecord]:
    return [r for r in run.records if isinstance(r, FaultRecord) and r.phase == "ok" and r.fault in kinds]


def _log_records(node: str, text: str) -> list[dict]:
    """Agent and trainer records of one node's log. A line without a `docker logs` timestamp
    takes the time torch printed in it (month, day and time of day; the year is unknown, so such
    times only order lines and show the time of day); a line with neither (a worker's own output,
    a traceback) the time of the next line that has one, as the agent reports a worker's error
    right after it, else of the last one."""
    lines = [parse_docker_timestamp(line) for line in text.splitlines()]
    times = [t if t is not None else _printed_time(body) for t, body in lines]
    following = None
    for index in reversed(range(len(times))):
        if times[index] is None:
            times[index] = following
        following = times[index]
    previous = 0.0
    for index, t in enumerate(times):  # lines after the last timed one
        if t is None:
            times[index] = previous
        previous = times[index]
    parser, records = NodeLogParser(node), []
    for t, (_, body) in zip(times, lines, strict=True):
        records.extend(parser.feed(t, body))
    records.extend(parser.close())
    return records


# glog ("I1130 14:05:21.251000", "[E1130 14:09:46.849360398"), and the rendezvous hook's
# logging format ("I2026-11-30 14:05:21,251").
_PRINTED_TIME = (
    re.compile(r"^\[?[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\.(?P<f>\d{1,6})"),
    re.compile(r"^[IWEF]\d{4}-(?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d),(?P<f>\d{1,6})"),
)
_YEAR_UNKNOWN = 2000  # a leap year, so that 29 February parses


def _printed_time(text: str) -> float | None:
    for pattern in _PRINTED_TIME:
        m = pattern.match(text)
        if m:
            try:
                stamp = datetime(
                    _YEAR_UNKNOWN,
                    int(m["mo"]),
                    int(m["d"]),
                    int(m["h"]),
                    int(m["mi"]),
                    int(m["s"]),
                    tzinfo=timezone.utc,
                )
            except ValueError:
                return None
            return stamp.timestamp() + float("0." + m["f"])
    return None


# --------------------------------------------------------------------------- evidence lines


def _at(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S") + f".{int(t * 10) % 10}"


def _line(record: Record, text: str | None = None) -> str:
    who = (record.where if isinstance(record, FaultRecord) else record.node) or "?"
    return f"{who} {_at(record.t)}  {text if text is not None else _describe(record)}"


def _describe(r: Record) -> str:
    if isinstance(r, FaultRecord):
        return f"fault {r.fault} on {r.target} ({r.phase})"
    if isinstance(r, DockerRecord):
        code = f" (exit code {r.exit_code})" if r.exit_code is not None else ""
        return f"container {r.action}{code}"
    if not isinstance(r, AgentRecord):
        return str(getattr(r, "event", None) or getattr(r, "kind", None) or r.TYPE)
    if r.event == "group_failed":
        return f"Worker group FAILED. {r.attempts_left}/{r.max_restarts} attempts left"
    if r.event == "worker_failed":
        return f"worker local_rank {r.local_rank} (pid {r.pid}) failed, exitcode {r.exitcode}"
    if r.event == "rdzv_joining":
        return "agent entered the rendezvous"
    if r.event == "error_file":
        return _root_cause(r.message or "")
    if r.event in ("exception", "worker_exception"):
        return f"{r.name}: {r.message}"
    return _tidy(r.message) if r.message else r.event


# What makes torch's lines long without telling anything: the glog or logging prefix, the rank
# prefix, and C++ source locations.
_NOISE = re.compile(
    r"^\[?[IWEF]\d{4}[ -][^\]]*\]\s*|^\[rank\d+\]:\s*|\[/[^\]]*\]\s*"
    r"|\btorch(\.\w+)+\.(?=\w+(Error|Exception)\b)"
)


def _tidy(message: str) -> str:
    return _NOISE.sub("", message).strip()


def _root_cause(message: str) -> str:
    """torchrun's root-cause block (" | "-joined lines) as rank, exit code and the error itself."""
    parts = [p.strip() for p in message.split(" | ")]
    fields = dict(re.match(r"(\w+)\s*:\s*(.*)", p).groups() for p in parts if re.match(r"\w+\s*:", p))
    error = next((p for p in reversed(parts) if re.search(r"(Error|Exception|Signal \d+)", p)), "")
    return _tidy(
        f"root cause: rank {fields.get('rank', '?')}, exitcode {fields.get('exitcode', '?')}"
        + (f": {error.removeprefix('traceback : ')}" if error else "")
    )


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _first_per_node(records: Iterable[Record]) -> list[Record]:
    seen, first = set(), []
    for r in records:
        if r.node not in seen:
            seen.add(r.node)
            first.append(r)
    return first


# --------------------------------------------------------------------------- the diagnoses


def shared_tcp_store(run: RunModel) -> Diagnosis | None:
    """(a) Restarted gloo groups cannot connect: torch's rendezvous TCP store, shared across restarts."""
    if run.env.get(STORE_OPT_OUT) == "1":
        return None
    failures = run.agent_events("worker_failed", "group_failed", "new_nodes")
    if not failures:
        return None
    first_failure = failures[0].t
    refused = [r for r in run.agent_events("worker_error") if r.kind == "gloo_connect" and r.t > first_failure]
    hung = _hung_after_restart(run, first_failure)
    if not refused and not hung:
        return None
    burned = [r for r in run.agent_events("group_failed") if refused and r.t >= refused[0].t]
    closed = run.agent_events("rdzv_closed")
    evidence = [
        _line(failures[0]),
        *map(_line, _first_per_node(refused)),
        *map(_line, burned),
        *map(_line, _first_per_node(closed)),
    ]
    evidence += [
        _line(started, f"worker group started again; no training and no error for {quiet:.0f} s after it")
        for started, quiet in hung
    ]
    parts = []
    if refused:
        nodes = ", ".join(sorted({r.node for r in refused}, key=node_order))
        parts.append(
            f"After the first failure, the new gloo process group failed to connect on {nodes} "
            f"(connectFullMesh failed ... Connection refused)."
        )
    if hung:
        parts.append("A restarted worker group never trained: its workers hang while they build the process group.")
    parts.append(
        "torch 2.13's agents hand their rendezvous TCP store to the workers and keep it across "
        "restarts, so a restarted group reads the previous group's stale addresses from it."
    )
    if burned:
        parts.append(f"Each such round fails and burns a restart ({len(burned)} burned this way).")
    if closed:
        parts.append("The job ended with RendezvousClosedError when an agent ran out of restarts.")
    return Diagnosis(
        "shared-tcp-store",
        "Restarted process groups cannot connect (torch's shared rendezvous store)",
        " ".join(parts),
        evidence,
        f"Set {STORE_OPT_OUT}=1 for the agents: `python -m sim up --env {STORE_OPT_OUT}=1` (in a scenario: "
        f"cluster.env). Or have the script build its process group on a store of its own for each start.",
    )


def _hung_after_restart(run: RunModel, first_failure: float) -> list[tuple[AgentRecord, float]]:
    """Worker groups started after the first failure that then showed nothing at all (no step, no
    error, no exit) for longer than FROZEN_HANG_S, in a run whose training is measured. The silence
    lasts until the run's end or the node's loss (its workers' own start-up records are not news)."""
    beats = run.beat_times
    if not any(t < first_failure for t in beats):
        return []  # nothing measures this script's progress: silence proves nothing
    hung = []
    for node in _agent_nodes(run):
        mine = [r for r in run.agent_events(*AGENT_NEWS, node=node) if r.t > first_failure]
        if not mine or mine[-1].event != "group_started":
            continue
        started = mine[-1]
        lost = [r.t for r in run.docker if r.t > started.t and r.node == node and r.action in NODE_LOSS_DOCKER]
        quiet = min(lost, default=run.t_end) - started.t
        if not any(t > started.t for t in beats) and quiet > FROZEN_HANG_S:
            hung.append((started, quiet))
    return hung


def restart_budget(run: RunModel) -> Diagnosis | None:
    """(b) An agent used up its --max-restarts: torch counts restarts per agent."""
    spent = []
    for node in _agent_nodes(run):
        used, most = _budget(run, node)
        root_cause = run.agent_events("error_file", node=node)
        after_last = used[-1].t if used else float("-inf")
        final = [r for r in run.agent_events("worker_failed", node=node) if r.t > after_last]
        # torchrun prints the root-cause block only when the agent gives up on its workers.
        if root_cause or (final and isinstance(most, int) and len(used) >= most):
            spent.append((node, used, most, final, root_cause))
    if not spent:
        return None
    evidence, names = [], []
    for node, used, most, final, root_cause in spent:
        names.append(f"{node} ({len(used)} of {most if most is not None else '?'})")
        failed = run.agent_events("worker_failed", node=node)
        for number, record in enumerate(used, 1):
            cause = [r for r in failed if r.t <= record.t]
            what = f"{_describe(cause[-1])}: " if cause else ""
            evidence.append(_line(record, f"{what}restart {number} of {most} used"))
        if final:
            evidence.append(_line(final[0], f"{_describe(final[0])}: no restart left"))
        evidence += [_line(r) for r in root_cause[:1]]
    gave_up = [s[0] for s in spent]
    others = []
    for node in _agent_nodes(run):
        if node not in gave_up:
            used, most = _budget(run, node)
            others.append(f"{node} used {len(used)} of {most if most is not None else '?'}")
    cause = (
        f"torchrun counts restarts per agent: each agent may restart its own workers --max-restarts times. "
        f"The agent on {', '.join(gave_up)} used all of its restarts and gave up at the next failure of its "
        "workers, which closes the rendezvous and ends the job on every node."
    )
    if others:
        cause += f" The other agents: {', '.join(others)}."
    fix = (
        "Give each agent as many restarts as failures it must survive (--max-restarts N; a fault test needs "
        "one per fault that hits the same node), and remove the cause of the failures themselves (the root "
        "cause above, and any other diagnosis)."
    )
    failure = script_failure(run)
    if failure is not None:
        cause += f" Every start failed the same way ({_clip(failure.exception, 120)}): the script's own error."
        fix = (
            "More restarts would not help: every start ends with the same error (script-error above). Fix that "
            "error; the restart budget is not the problem."
        )
    return Diagnosis("restart-budget", f"Restart budget used up on {', '.join(names)}", cause, evidence, fix)


def _budget(run: RunModel, node: str) -> tuple[list[AgentRecord], int | None]:
    """The restarts an agent used (its "Worker group FAILED. k/m attempts left" records) and its --max-restarts."""
    used = run.agent_events("group_failed", node=node)
    most = used[-1].max_restarts if used else run.spec_fields.max_restarts
    return used, most


def waiting_for_nodes(run: RunModel) -> Diagnosis | None:
    """(c) Agents wait in the rendezvous for more nodes than are live (or reachable)."""
    min_nodes = run.spec_fields.min_nodes
    timeouts = run.agent_events("rdzv_timeout")
    waiting = _waiting_now(run)
    if not timeouts and not waiting:
        return None
    live, lost = _live_nodes(run, until=min(r.t for r in [*timeouts, *waiting]))
    short = isinstance(min_nodes, int) and live is not None and len(live) < min_nodes
    evidence = []
    for record in timeouts:
        entered = [r for r in run.agent_events("rdzv_joining", node=record.node) if r.t <= record.t]
        if entered:
            evidence.append(
                _line(entered[-1], f"agent entered the rendezvous, waited {record.t - entered[-1].t:.0f} s")
            )
        evidence.append(_line(record, "RendezvousTimeoutError: not enough nodes joined in time"))
    evidence += [_line(r, f"agent in the rendezvous for {run.t_end - r.t:.0f} s, not complete") for r in waiting]
    evidence += [_line(r) for r in lost]
    cut_off = _first_per_node(run.agent_events("keepalive_failed")) + _fault_records(run, "partition")
    evidence += [_line(r) for r in cut_off]
    need = (
        f"at least {min_nodes} nodes (--min-nodes) have joined"
        if isinstance(min_nodes, int)
        else "the job's minimum number of nodes (torchrun --nnodes MIN:MAX) have joined"
    )
    have = f"; {len(live)} node(s) were live ({', '.join(live) or 'none'})" if live is not None else ""
    cut = (
        " A node that cannot reach the rendezvous backend (keep-alive failed, partitioned) counts as gone."
        if cut_off
        else ""
    )
    done = " and gave up with RendezvousTimeoutError after join_timeout" if timeouts else ""
    return Diagnosis(
        "waiting-for-nodes",
        "Agents wait in the rendezvous for more nodes" + (": too few live" if short else ""),
        f"The rendezvous cannot complete until {need}{have}. The agents waited{done}.{cut}",
        evidence,
        "Bring the missing nodes back (start the node, heal the partition) or lower the minimum "
        "(`--min-nodes`, torchrun --nnodes MIN:MAX) so the live nodes suffice. The agents wait up to "
        "join_timeout (600 s by default; `--rdzv-conf join_timeout=S`), and drop an unreachable node after "
        "keep_alive_interval x keep_alive_max_attempt (15 s by default).",
    )


def _waiting_now(run: RunModel) -> list[AgentRecord]:
    """Agents whose last rendezvous has not completed for RDZV_WAIT_S, while no round completed and
    no worker trained since (a spare agent waits too, but beside a job that trains)."""
    beats, waiting = run.beat_times, []
    completed = [r.t for r in run.agent_events("rdzv_complete")]
    for node in _agent_nodes(run):
        mine = run.agent_events(
            "rdzv_joining",
            "rdzv_complete",
            "group_finished",
            "rdzv_closed",
            "rdzv_timeout",
            "rdzv_error",
            "rdzv_graceful_exit",
            "exception",
            "error_file",
            node=node,
        )
        if not mine or mine[-1].event != "rdzv_joining" or run.t_end - mine[-1].t <= RDZV_WAIT_S:
            continue
        since = mine[-1].t
        if not any(t > since for t in completed) and not any(t > since for t in beats):
            waiting.append(mine[-1])
    return waiting


def _live_nodes(run: RunModel, until: float) -> tuple[list[str] | None, list[DockerRecord]]:
    """Nodes whose container was up at `until` (from Docker events), and the records that took nodes out."""
    count = run.spec_nodes
    if count is None:
        return None, []
    up = {f"node{i}": True for i in range(count)}
    lost = []
    for r in run.docker:
        if r.t > until:
            break
        node = r.node
        if not AGENT_CONTAINER.match(str(node)):
            continue  # etcd, or the throwaway container of wipe-etcd: no training node
        if r.action in ("die", "kill", "stop", "destroy"):
            if up.get(node):
                lost.append(r)
            up[node] = False
        elif r.action == "start":
            up[node] = True
    return sorted((n for n, on in up.items() if on), key=node_order), lost


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


def _frozen_node(pause: FaultRecord | DockerRecord) -> str | None:
    return pause.target if isinstance(pause, FaultRecord) else pause.node


def process_group_timeout(run: RunModel) -> Diagnosis | None:
    """(e) Workers hang in a collective until the process group's timeout after a peer froze."""
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
    cause = (
        "A peer stopped answering (frozen, stopped or cut off) while the others were inside a collective. "
        "They wait for it until the process group's timeout (30 minutes by default for gloo): its agent "
        "still looks alive to torchrun, so nothing restarts the group meanwhile."
    )
    if timeouts:
        cause += f" The collective timed out{limit} on {', '.join(sorted({r.node for r in timeouts}))}."
    return Diagnosis(
        "process-group-timeout",
        "Hang in a collective until the process group's timeout",
        cause,
        evidence,
        "Pass a timeout to init_process_group that suits the job, e.g. "
        'dist.init_process_group("gloo", timeout=timedelta(seconds=60)): the blocked collective then fails, the '
        "worker exits and torchrun regroups without the frozen node.",
    )


def nccl_dead_peer(run: RunModel) -> Diagnosis | None:
    """Survivors blocked in a collective until the process group's timeout after a peer died: NCCL's
    failure timing (real, or emulated on CPU by images/node/elastic_sim_devices.py, whose "nccl_watchdog"
    record each such worker writes before it aborts as ProcessGroupNCCL's watchdog does)."""
    held = [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "nccl_watchdog"]
    if not held:
        return _nccl_watchdog_logged(run)
    first = min(held, key=lambda r: r.t)
    began = first.began if first.began is not None else first.t - (first.seconds or 0.0)
    losses = [
        f
        for f in _fault_records(run, *names_where(lambda kind: kind.loses_node or kind.ends_workers))
        if f.t <= began + 5.0
    ]
    loss = losses[-1] if losses else None
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
        NCCL_DEAD_PEER_FIX,
    )


def _nccl_watchdog_logged(run: RunModel) -> Diagnosis | None:
    """A real NCCL run (no emulation records): the watchdog's own lines after a peer's node or process died."""
    words = "Watchdog caught collective operation timeout"
    logged = [r for r in run.agent_events("worker_error") if words in (r.message or "")]
    lost = _fault_records(run, *names_where(lambda kind: kind.loses_node or kind.ends_workers))
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
        NCCL_DEAD_PEER_FIX,
    )


def _frozen_stalls(run: RunModel) -> list[tuple[FaultRecord | DockerRecord, float]]:
    """Pauses (of a node, of a worker, of a worker's collectives) after which no worker anywhere
    showed progress for longer than FROZEN_HANG_S."""
    beats = run.beat_times
    if not beats:
        return []  # nothing measures progress for this script: no claim
    stalls = []
    pauses = _fault_records(run, "pause", "hang-worker", "hang-collectives") or [
        r for r in run.docker if r.action == "pause"
    ]
    for pause in pauses:
        target = _frozen_node(pause)
        resumed = [
            r.t
            for r in run.records
            if r.t > pause.t
            and (
                (isinstance(r, FaultRecord) and r.fault in ("unpause", "resume-worker") and r.target == target)
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


def c10d_store_lost(run: RunModel) -> Diagnosis | None:
    """(f) The agent hosting the c10d rendezvous store is gone: every other agent exits."""
    lost_store = [r for r in run.agent_events("rdzv_error", "keepalive_failed") if "C10d store" in (r.message or "")]
    if not lost_store and run.spec_fields.rdzv_backend == "c10d":
        lost_store = [r for r in run.agent_events("rdzv_error") if "RendezvousConnectionError" in (r.message or "")]
    finished = [r.t for r in run.agent_events("group_finished")]
    lost_store = [r for r in lost_store if not any(t < r.t for t in finished)]  # not the job's own end
    if not lost_store:
        return None
    host = "node0" if run.spec_fields.rdzv_backend == "c10d" else None  # sim's --rdzv-endpoint (sim/core/torchrun.py)
    first = lost_store[0].t
    gone = [
        r
        for r in run.records
        if r.t <= first
        and (
            (
                isinstance(r, FaultRecord)
                and r.phase == "ok"
                and kind_of(r.fault).loses_node
                and (host is None or host in str(r.target))
            )
            or (isinstance(r, DockerRecord) and r.action in NODE_LOSS_DOCKER and (host is None or r.node == host))
        )
    ]
    evidence = [_line(r) for r in gone[-2:]] + [_line(r) for r in _first_per_node(reversed(lost_store))]
    where = f" ({host})" if host else ""
    when = f", lost at {_at(gone[-1].t)}" if gone else ""
    nodes = ", ".join(sorted({r.node for r in lost_store}, key=node_order))
    return Diagnosis(
        "c10d-store-lost",
        f"c10d rendezvous store lost with its host{where}",
        f"With --rdzv-backend c10d the rendezvous store lives inside the agent on the --rdzv-endpoint "
        f"host{where}{when}. torch does not elect a new store host, so the other agents ({nodes}) could no "
        f"longer reach the store (RendezvousConnectionError) and exited: the job ends.",
        evidence,
        "For a job that must survive losing any node, use --rdzv-backend etcd-v2 (etcd runs outside the "
        "training nodes); with c10d, keep the endpoint host out of the faults (a dedicated, stable host).",
    )


def etcd_lost(run: RunModel) -> Diagnosis | None:
    """(f2) etcd went away (restarted, killed, paused, cut off) while the agents called it: torch's etcd-v2
    agents end on their first failed call; rendezvous-etcd-v3's wait for etcd up to reconnect_timeout,
    then end on their next call. The job ends with the last agent."""
    backend = run.spec_fields.rdzv_backend
    if backend not in ("etcd", "etcd-v2", "etcd-v3"):
        return None
    v3 = backend == "etcd-v3"
    finished = [r.t for r in run.agent_events("group_finished")]
    failed = [
        r
        for r in run.agent_events("rdzv_error", "worker_error")
        if _etcd_call_failed(r, v3)
        and not any(t < r.t for t in finished)  # not the job's own end
        and any(d.node == r.node and d.action == "die" and 0 <= d.t - r.t <= ETCD_LOSS_EXIT_S for d in run.docker)
    ]
    if not failed:
        return None
    outages = [
        r
        for r in run.records
        if r.t <= failed[-1].t
        and (
            (isinstance(r, FaultRecord) and r.phase == "ok" and "etcd" in f"{r.fault} {r.target}")
            or (isinstance(r, DockerRecord) and r.node == "etcd" and r.action in ("die", "kill", "pause", "stop"))
        )
    ]
    # Each agent's end under the outage just before it: several outages may each have ended some.
    ended: dict[float | None, list[AgentRecord]] = {}
    for record in _first_per_node(failed):
        before = [o.t for o in outages if o.t <= record.t + 1.0]
        ended.setdefault(before[-1] if before else None, []).append(record)
    words = "; ".join(
        f"{'at ' + _at(t) if t is not None else 'once'} {', '.join(sorted((r.node for r in group), key=node_order))} "
        f"ended" + (f" {group[0].t - t:.0f} s later" if v3 and t is not None else "")
        for t, group in ended.items()
    )
    evidence = []
    for t, group in ended.items():
        evidence += [_line(o) for o in outages if o.t == t][:1] + [_line(r) for r in group]
    if v3:
        waited = next((m[1] for r in failed if (m := RECONNECT_TIMEOUT.search(r.message or ""))), "30")
        return Diagnosis(
            "etcd-lost",
            "etcd unreachable past reconnect_timeout: the etcd-v3 agents ended",
            f"rendezvous-etcd-v3's agents connect again while etcd is away, for reconnect_timeout ({waited} s, "
            "counted from the first failed connect and shared by every call), then end on their next call; etcd "
            f"stayed away longer: {words}. Training itself needs no etcd, so a job that finishes within that time "
            "never notices.",
            evidence,
            "Bring etcd back within reconnect_timeout (a restart that keeps its data is ridden out), or allow the "
            "outage you expect (`--rdzv-conf reconnect_timeout=120`); give the agents an etcd that outlives a "
            "member's loss (a replicated etcd behind one stable address), or use --rdzv-backend c10d (no etcd; the "
            "store lives on one training host).",
        )
    return Diagnosis(
        "etcd-lost",
        "etcd unreachable: the etcd-v2 agents ended",
        "torch's etcd-v2 rendezvous makes every agent end on its first failed etcd call (a keep-alive, a "
        f"rendezvous step); etcd was away while agents called it: {words}. Whether a short outage ends an "
        "agent depends on whether one of its calls lands inside it; the job ends with the last agent.",
        evidence,
        "Give the agents an etcd endpoint that outlives a member's restart (a replicated etcd behind one stable "
        "address: torch's etcd-v2 backend takes a single --rdzv-endpoint), or use --rdzv-backend etcd-v3 (pip "
        "install torch-rendezvous-etcd-v3: its calls connect again for reconnect_timeout) or c10d (no etcd; the "
        "store lives on one training host).",
    )


def _etcd_call_failed(record: AgentRecord, v3: bool) -> bool:
    """An agent's etcd call failed: torch's RendezvousConnectionError ("The connection to etcd has failed"); for
    etcd-v3 also its client's own words, which the agent's log may show first (a traceback's last line the log
    parser read as a worker error: "cannot connect to etcd at etcd:2379: [Errno -2] Name or service not known")."""
    message = record.message or ""
    if record.event == "rdzv_error":
        return "connection to etcd" in message
    return v3 and "cannot connect to etcd" in message


def engine_lost(run: RunModel) -> Diagnosis | None:
    """(a0) The Docker engine stopped answering during the run (the collector's "engine_lost" record): every
    container went with it, so what follows in the history is not the job's doing."""
    # From every record: the engine's own shutdown kills the containers as `down` does, so the run's cut at
    # the teardown (RunModel.records) comes before this record.
    lost = [r for r in run.all_records if isinstance(r, RunRecord) and r.event == "engine_lost"]
    if not lost:
        return None
    record = lost[0]
    steps = [r for r in run.progress if r.t <= record.t]
    last = f"; the last progress before it at {_at(steps[-1].t)}" if steps else ""
    return Diagnosis(
        "engine-lost",
        "The Docker engine stopped during the run",
        f"The Docker engine stopped answering at {_at(record.t)}{last}. The cluster's containers are the "
        "engine's children: the nodes, etcd and the job ended with it, and the collector stopped recording, so "
        "this run says nothing about the job's own fault tolerance.",
        [f"host {_at(record.t)}  {record.why}"],
        "Find why the engine stopped (`journalctl -u docker`, or dockerd's own log; out of memory or disk on the "
        "host, a package upgrade, `systemctl stop docker`), start it (`bash scripts/setup.sh` starts it where "
        "systemd does not), remove the leftovers (`python -m sim down NAME`) and run again.",
    )


def etcd_without_v2(run: RunModel) -> Diagnosis | None:
    """(g) etcd answers 404 on the v2 API that torch's etcd backends (python-etcd) speak."""
    if run.spec_fields.rdzv_backend not in (None, "etcd", "etcd-v2"):
        return None  # etcd-v3 speaks the v3 API; its connection errors are no sign of a missing v2
    found = [
        r
        for r in run.agent_events("exception", "rdzv_error")
        if "404" in (r.message or "") and r.event == "exception" and (r.name or "").startswith("etcd.")
    ]
    if not found:
        return None
    failed = [r for r in run.agent_events("rdzv_error") if "connection to etcd" in (r.message or "")]
    return Diagnosis(
        "etcd-without-v2",
        "etcd has no v2 API",
        "torch's etcd and etcd-v2 rendezvous backends use python-etcd, which speaks only etcd's v2 API; this etcd "
        "answers 404 on it (etcd 3.4/3.5 serve v2 only with --enable-v2, and etcd 3.6 removed it), so every "
        "agent fails before the first rendezvous.",
        [_line(r) for r in _first_per_node(found) + _first_per_node(failed)],
        "Run etcd 3.4 or 3.5 with --enable-v2 (elastic-sim's default etcd 3.4 does), or use --rdzv-backend etcd-v3 "
        "(pip install torch-rendezvous-etcd-v3; see rendezvous-etcd-v3/README.md) or c10d.",
    )


def spare_agent_exit(run: RunModel) -> Diagnosis | None:
    """(h) A spare agent exits 1 with an AttributeError when the job ends without it (a torch bug)."""
    crashed = [
        r
        for r in run.agent_events("exception")
        if r.name == "AttributeError" and "'NoneType' object has no attribute 'is_failed'" in (r.message or "")
    ]
    if not crashed:
        return None
    nodes = sorted({r.node for r in crashed}, key=node_order)
    graceful = [r for r in run.agent_events("rdzv_graceful_exit") if r.node in nodes]
    return Diagnosis(
        "spare-agent-exit",
        f"Spare agent exited 1 with AttributeError at job end: {', '.join(nodes)}",
        "The node joined when the job already had --max-nodes and waited as a spare (torch's redundancy list). "
        "When the job closed the rendezvous, the spare left through RendezvousGracefulExitError, after which "
        "torchrun calls is_failed() on the missing result (torch 2.13 launcher/api.py) and exits 1. It never "
        "trained: the job itself is not affected.",
        [_line(r) for r in _first_per_node(graceful) + _first_per_node(crashed)],
        "Nothing to fix in the job: do not count this node's exit code as a failure, or start no more nodes "
        "than --max-nodes.",
    )


def disk_full(run: RunModel) -> Diagnosis | None:
    """(i) A write failed with ENOSPC (`Errno 28`): the checkpoint disk is full."""
    full = [r for r in run.agent_events("worker_error") if r.kind == "disk_full"]
    if not full:
        return None
    fills = [r for r in _fault_records(run, "fill-disk") if r.t <= full[-1].t]
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
    written = fault.outcome.written
    size = f" of {written >> 20} MiB" if written is not None else ""
    return f"filler file {fault.outcome.file or '?'}{size} written, the disk full"


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
            (r for r in _fault_records(run, "oom-worker") if r.where == oom.node and abs(r.t - oom.t) <= OOM_EXIT_S),
            None,
        )
        lines = [(oom, "Docker event oom: the kernel's OOM killer killed a process in the container")]
        lines += [(r, f"{_describe(r)}: SIGKILL from the OOM killer") for r in exits]
        if fault is not None:
            injected = True
            limit = fault.outcome.limit
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
    damage = _fault_records(run, *names_where(lambda kind: kind.damages_checkpoint))
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
    file = before[-1].outcome.file
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
    result = fault.outcome
    if fault.fault == "kill-during-checkpoint":
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
    frozen = _fault_records(run, "freeze-during-checkpoint", "pause")
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


def name_resolution(run: RunModel) -> Diagnosis | None:
    """(m) A name inside the cluster (etcd, the store host, a peer) stopped resolving."""
    # A container that is down has no name in Docker's DNS: that is the fault (etcd killed), not this.
    failed = [
        r
        for r in run.agent_events("worker_error")
        if r.kind == "name_resolution" and any(_up_at(run, name, r.t) for name in _unresolved(r.message))
    ]
    if not failed:
        return None
    nodes = ", ".join(sorted({r.node for r in failed}, key=node_order))
    names = sorted({name for r in failed for name in _unresolved(r.message)})
    what = f" ({', '.join(names)})" if names else ""
    return Diagnosis(
        "name-resolution",
        f"Names inside the cluster did not resolve on {nodes}",
        f"A host name the job needs{what} did not resolve (Name or service not known) on {nodes}, so the agents "
        "could not reach the rendezvous backend, or the workers rank 0's store, and the round failed. Nothing in "
        "the job does that: the cluster's DNS stopped answering.",
        [_line(r) for r in _first_per_node(failed)],
        "Bring the cluster up again (`python -m sim down`, then `up`). On a Docker 20.10 engine, leaving a swarm "
        "breaks the DNS of networks made while the swarm existed (docs/SWARM.md): do not init or leave a swarm "
        "while clusters run. On a real cluster, check that MASTER_ADDR and the rendezvous endpoint resolve on "
        "every host (DNS, /etc/hosts).",
    )


def _unresolved(message: str | None) -> list[str]:
    """The host names an error line failed to resolve ("etcd at etcd:2379", "(node0, 60543)")."""
    return re.findall(r"(?:at |\(|resolve ')([a-z][\w-]*)(?=[:,'])", message or "")


def _up_at(run: RunModel, name: str, t: float) -> bool:
    """Whether container `name` was running (or paused) at t, as far as Docker's events say."""
    events = [r.action for r in run.docker if r.node == name and r.t <= t]
    down = ("die", "kill", "stop", "destroy", "oom")
    return not events or next((a for a in reversed(events) if a in (*down, "start", "restart")), "start") not in down


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


# torch's dynamic rendezvous keep-alive defaults: a heartbeat older than interval x attempts is a dead node.
KEEP_ALIVE_INTERVAL_S = 5
KEEP_ALIVE_MAX_ATTEMPT = 3


def _keep_alive_window(run: RunModel) -> float:
    conf = run.spec_fields.pairs["rdzv_conf"]
    try:
        return float(conf.get("keep_alive_interval", KEEP_ALIVE_INTERVAL_S)) * float(
            conf.get("keep_alive_max_attempt", KEEP_ALIVE_MAX_ATTEMPT)
        )
    except ValueError:
        return float(KEEP_ALIVE_INTERVAL_S * KEEP_ALIVE_MAX_ATTEMPT)


def clock_skew(run: RunModel) -> Diagnosis | None:
    """(p) A node's clock was skewed past the keep-alive window, and then the agents disagreed on who was
    in a round: a round's size counted differently, or the skewed node in a round of its own (two groups)."""
    window = _keep_alive_window(run)
    skews = [f for f in _fault_records(run, "skew-clock") if abs(f.outcome.by or 0) > window]
    if not skews:
        return None
    skew = skews[0]
    rounds: dict[int, list[AgentRecord]] = {}
    for joined in run.agent_events("rdzv_joined"):
        if joined.t > skew.t and joined.round is not None:
            rounds.setdefault(joined.round, []).append(joined)
    miscounted = next((joined for joined in rounds.values() if len({r.nodes for r in joined}) > 1), None)
    apart = [joined for joined in rounds.values() if {r.node for r in joined} == {skew.node} and joined[0].nodes == 1]
    if miscounted is None and not (apart and len(rounds) > 1):
        return None
    by = skew.outcome.by or 0
    ahead = by > 0
    shown = miscounted or [r for joined in rounds.values() for r in joined]
    finished = run.agent_events("group_finished") if miscounted else []
    waiting = [r for r in finished if r.t > shown[0].t and not _died_after(run, r)]
    stuck = [r for r in miscounted or () if not run.agent_events("group_started", node=r.node) or
             max(g.t for g in run.agent_events("group_started", node=r.node)) < r.t]  # fmt: skip
    if miscounted is not None:
        sizes = ", ".join(f"{r.node}: {r.nodes}" for r in miscounted)
        what = f"in round {miscounted[0].round} the agents counted different worlds ({sizes})."
        if stuck:
            what += (
                f" {', '.join(r.node for r in stuck)} joined that round but never started its workers: its agent "
                "waits for a round its own view says is not complete."
            )
        if waiting:
            what += (
                " Each agent's exit barrier counts to the group size it believes, so at the end the agents that "
                "counted more wait in torch's exit barrier until its 300 s timeout."
            )
    else:
        what = (
            f"the others regrouped without {skew.node}, and {skew.node} then made a round of its own "
            f"(round {apart[0][0].round}, a world of 1): two groups trained at once, each with its own rank 0 "
            "writing checkpoints to the same place (a split brain)."
        )
    return Diagnosis(
        "clock-skew",
        f"{skew.node}'s clock was {abs(by):g} s {'ahead of' if ahead else 'behind'} the others': the agents "
        f"disagreed on who was alive",
        f"torch's dynamic rendezvous stamps each node's heartbeat with the clock of the node that writes it, and "
        f"every agent drops, at each sync of the rendezvous state, a node whose heartbeat looks older than "
        f"keep_alive_interval x keep_alive_max_attempt ({window:g} s here) by its own clock. "
        + (
            f"{skew.node}, ahead, saw every peer's heartbeat as {by:g} s old and dropped them: "
            if ahead
            else f"The others saw {skew.node}'s heartbeats as {-by:g} s old and dropped it: "
        )
        + what,
        [_line(skew, f"skew-clock {by:+g} s")]
        + [_line(r, f"joined round {r.round} as rank {r.group_rank} in a world of {r.nodes}") for r in shown]
        + [_line(r, "never started its workers after this round") for r in stuck]
        + [_line(r, "worker group finished; waiting for the other agents (no exit after it)") for r in waiting],
        "Keep the nodes' clocks in sync (chrony or NTP; alert on an offset near the window). A skew below "
        "keep_alive_interval x keep_alive_max_attempt is harmless: raise them with --rdzv-conf above the worst "
        "skew you expect, at the price of noticing a lost node that much later.",
    )


def _died_after(run: RunModel, record: Record) -> bool:
    return any(r.node == record.node and r.action == "die" and r.t >= record.t for r in run.docker)


# --------------------------------------------------------------------------- (r) a peer lost during init

# Survivors held inside init_process_group this long after a peer's loss: torch's init does not notice it.
INIT_HELD_S = 60.0
# torch 2.13's init_process_group default timeout (torch/distributed/constants.py, default_pg_timeout), which
# bounds the rendezvous store's waits in init; NCCL's own default (default_pg_nccl_timeout) is 10 minutes.
INIT_DEFAULT_TIMEOUT_S = 1800
WAITED_MS = re.compile(r"(?:timeout after|waiting|Timed out after) (\d+)\s?(ms|seconds)")


def init_peer_lost(run: RunModel) -> Diagnosis | None:
    """(r) A node lost while its round's workers were still inside init_process_group: the others wait for it
    in the store (and gloo's connection set-up) until init's timeout, and nothing regroups meanwhile."""
    losses = [f for f in _fault_records(run, *names_where(lambda kind: kind.loses_node)) if f.where]
    losses += [
        r
        for r in run.docker
        if r.action in ("die", "kill") and AGENT_CONTAINER.match(str(r.node))
        and not any(f.where == r.node and abs(f.t - r.t) < 5.0 for f in losses)
    ]  # fmt: skip
    for loss in sorted(losses, key=lambda r: r.t):
        lost = _frozen_node(loss) if isinstance(loss, FaultRecord) and loss.fault == "pause" else (
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


# --------------------------------------------------------------------------- (s) a late join at the job's end

# A finished agent whose container lived on this long after its group finished waited in torch's exit barrier
# (exit_barrier_timeout, 300 s in torch 2.13's agent; torchrun offers no option for it).
EXIT_BARRIER_WAIT_S = 30.0
EXIT_BARRIER_S = 300


def late_join_at_end(run: RunModel) -> Diagnosis | None:
    """(s) A node joined as the job finished: the finished agents closed the rendezvous under it, and its agent
    ended with RendezvousClosedError (exit 1) without training in the last round: a node added, or one back from
    a fault (a thawed node whose old worker failed), came to join after the others had finished."""
    finished = run.agent_events("group_finished")
    late = [
        (closed, [r for r in finished if r.node != closed.node and r.t <= closed.t])
        for closed in run.refused_at_end().values()
    ]
    if not late:
        return None
    joiners = [closed.node for closed, _ in late]
    names = ", ".join(joiners)
    evidence = []
    for closed, done in late:
        node = closed.node
        joined = [
            f
            for f in _fault_records(run, "scale", "restart-node")
            if node in (*(f.outcome.joined or ()), f.outcome.node)
        ]
        started = [r for r in run.docker if r.node == node and r.action == "start" and r.t <= closed.t]
        evidence += [_line(f, f"fault {f.fault} ({f.target}): {node} joined") for f in joined[-1:]]
        evidence += [_line(r, f"{node}'s container started") for r in started[-1:] if not joined]
        evidence += [_line(r, "worker group finished (the job's end)") for r in _first_per_node(done)]
        evidence += [_line(r) for r in run.agent_events("rdzv_joining", node=node) if r.t <= closed.t][-1:]
        evidence.append(_line(closed, "RendezvousClosedError: the rendezvous was closed"))
        evidence += [_line(r) for r in run.docker if r.node == node and r.action == "die" and r.t >= closed.t][:1]
    waited = []
    for r in _first_per_node(finished):
        if r.node in joiners:
            continue
        died = [d.t for d in run.docker if d.node == r.node and d.action == "die" and d.t >= r.t]
        if (min(died, default=run.t_end) - r.t) > EXIT_BARRIER_WAIT_S:
            waited.append((r, min(died, default=run.t_end) - r.t))
    evidence += [_line(r, f"finished, then waited {w:.0f} s in torch's exit barrier") for r, w in waited]
    first_done = min(r.t for _, done in late for r in done)
    trained = [n for n in _agent_nodes(run) if n not in joiners and run.agent_events("group_started", node=n)]
    all_done = all(
        run.agent_events("group_finished", node=n)
        and run.agent_events("group_finished", node=n)[-1].t > run.agent_events("group_started", node=n)[-1].t
        for n in trained
    )
    barrier = (
        f" The finished agents {', '.join(r.node for r, _ in waited)} waited in torch's exit barrier (up to "
        f'{EXIT_BARRIER_S} s, "Timeout while waiting for keys") for an agent that would never arrive.'
        if waited
        else ""
    )
    return Diagnosis(
        "late-join-at-end",
        f"{names} joined as the job ended: RendezvousClosedError, exit 1",
        f"{names} joined at the job's end: the other agents' worker groups finished at {_at(first_done)} and "
        f"they closed the rendezvous, so {names}'s agent found it closed (RendezvousClosedError) and exited 1 "
        f"without training in the last round.{barrier}"
        + (" The training itself had finished: every worker group of the last round succeeded." if all_done else ""),
        evidence,
        "Harmless to the training, which had completed; the exit code 1 is the late node's. In a test, join nodes "
        "(sim scale) while the job is steady, well before its end, so that it regroups and trains with them, "
        "and leave the job's last steps free of membership changes. On a real cluster, do not add nodes to a job "
        "that is finishing, or treat a joiner's RendezvousClosedError after the others succeeded as benign.",
    )


# --------------------------------------------------------------------------- (q) the script's own error

# Exceptions that end a worker without being its script's fault: the process group or a peer breaking (their
# own diagnoses), a signal, an exit.
NOT_SCRIPT_ERRORS = re.compile(
    r"(^|\.)(Dist\w*Error|SignalException|KeyboardInterrupt|SystemExit|ChildFailedError|Rendezvous\w+Error)$"
)
# The node's folders: the script's own (read-only in every node) and the shared checkpoint volume.
USER_DIR = "/opt/sim/user"
CKPT_DIR = "/ckpt"
# Top-level modules whose pip name differs (what a requirements file must say).
PIP_NAMES = {
    "yaml": "pyyaml",
    "cv2": "opencv-python",
    "PIL": "pillow",
    "sklearn": "scikit-learn",
    "skimage": "scikit-image",
    "google.protobuf": "protobuf",
    "wandb": "wandb",
}
NO_GPU = re.compile(
    r"doesn't have NCCL built in|Torch not compiled with CUDA enabled|No CUDA GPUs are available|"
    r"Found no NVIDIA driver|CUDA driver initialization failed|NCCL (is )?not available|"
    r"device_ids .*(single-device|GPU modules)|ProcessGroupNCCL is only supported with GPUs|"
    # torch.cuda.set_device and friends on the CPU build: its torch._C has no CUDA bindings
    r"torch\._C' has no attribute '_cuda_"
)
EMULATION_ERROR = "elastic-sim device emulation:"


@dataclasses.dataclass(frozen=True)
class _ScriptFailure:
    name: str
    message: str
    frame: str
    source: str | None
    starts: dict[str, int]  # node -> its worker-group starts this exception ended
    first: AgentRecord
    after_a_clean_start: bool = False  # an earlier start ran without it: it came with a restart

    @property
    def exception(self) -> str:
        return f"{self.name}: {self.message}" if self.message else self.name


def script_failure(run: RunModel) -> _ScriptFailure | None:
    """The exception that ended every worker-group start of the nodes it shows on: the same type, message
    (numbers aside) and last frame in the user's own files. None when no such exception, or when the
    failures are the process group's or a peer's (their diagnoses name those)."""
    counts: dict[tuple, dict[str, int]] = {}
    firsts: dict[tuple, AgentRecord] = {}
    spoilt: set[tuple] = set()  # seen on a node, but not at each of its starts since the first time
    resumed: set[tuple] = set()  # first seen after a start that ran without it
    for node in _agent_nodes(run):
        starts = [r.t for r in run.agent_events("group_started", node=node)]
        if not starts:
            continue
        per_start: list[set[tuple]] = [set() for _ in starts]
        failed = [r.t for r in run.agent_events("worker_failed", node=node)]
        for r in run.agent_events("worker_exception", node=node):
            index = sum(1 for t in starts if t <= r.t) - 1
            if index < 0 or not r.frame or not _script_own(r):
                continue
            next_start = starts[index + 1] if index + 1 < len(starts) else float("inf")
            if not any(r.t <= t < next_start for t in failed):
                continue  # the start went on (an exception caught, or "Exception ignored in ..."): not its end
            key = (r.name, re.sub(r"\d+", "#", r.message or ""), r.frame)
            per_start[index].add(key)
            firsts.setdefault(key, r)
        for key in set().union(*per_start):
            since = next(i for i, seen in enumerate(per_start) if key in seen)
            if all(key in seen for seen in per_start[since:]):
                counts.setdefault(key, {})[node] = len(starts) - since
                if since:
                    resumed.add(key)
            else:
                spoilt.add(key)
    found = [(key, nodes) for key, nodes in counts.items() if key not in spoilt]
    if not found:
        return None
    key, nodes = max(found, key=lambda item: (sum(item[1].values()), -firsts[item[0]].t))
    first = firsts[key]
    if sum(nodes.values()) < 2 and (not _job_ended_with(run, first) or run.agent_events("group_finished")):
        return None  # one start, and the job went on (or finished elsewhere): nothing says it fails every time
    return _ScriptFailure(
        first.name or "", first.message or "", first.frame or "", first.source, nodes, first, key in resumed
    )


def _script_own(r: AgentRecord) -> bool:
    """Whether an exception is the script's own, not the process group's, a peer's or a damaged checkpoint's."""
    if NOT_SCRIPT_ERRORS.search(r.name or ""):
        return False
    return r.kind is None and worker_error_kind(f"{r.name}: {r.message}") is None


def _job_ended_with(run: RunModel, exception: AgentRecord) -> bool:
    """No worker group started after this exception, on any node: it ended the job."""
    return not any(r.t > exception.t for r in run.agent_events("group_started"))


def script_error(run: RunModel) -> Diagnosis | None:
    """(q) Workers fail the same way at every start: the script's own exception, which no restart can cure."""
    failure = script_failure(run)
    if failure is None:
        return None
    total = sum(failure.starts.values())
    where = ", ".join(
        f"{count} on {node}" for node, count in sorted(failure.starts.items(), key=lambda i: node_order(i[0]))
    )
    exception = failure.exception
    evidence = [
        _line(r, f"{r.name}: {r.message} at {r.frame}" + (f": `{r.source}`" if r is failure.first and r.source else ""))
        for node in sorted(failure.starts, key=node_order)
        for r in run.agent_events("worker_exception", node=node)[:3]
        if r.name == failure.name and r.frame == failure.frame
    ]
    restarted = any(count > 1 for count in failure.starts.values())
    how = (
        "It ended every start the same way, so restarts cannot help: each one runs into it again."
        if restarted
        else "A restart would run into it again: it is the script's own error, not a fault."
    )
    if failure.after_a_clean_start:
        how = (
            f"The first start(s) ran without it; from {_at(failure.first.t)} on it ended every start, so more "
            "restarts cannot help: look at what a restarted worker does differently (the resume from its checkpoint)."
        )
    title_what, fix = _script_error_fix(failure)
    return Diagnosis(
        "script-error",
        f"The script fails at every {'restart' if failure.after_a_clean_start else 'start'}{title_what}: "
        f"{_clip(exception, 120)}",
        f"{exception}, raised at {failure.frame}"
        + (f" ({failure.source})" if failure.source else "")
        + f", ended {total} worker-group start(s) ({where}). {how}",
        evidence,
        fix,
    )


def _script_error_fix(failure: _ScriptFailure) -> tuple[str, str]:
    """A few words for the title, and the fix, for the common start-up crashes."""
    name, message = failure.name, failure.message
    text = f"{name}: {message}"
    if EMULATION_ERROR in text:
        said = text.split(EMULATION_ERROR, 1)[1].strip()
        return (
            " (a CUDA feature the emulation cannot run)",
            f"elastic-sim's device emulation says: {said} Do what it says, or run on real GPUs with `--gpus N`.",
        )
    if NO_GPU.search(text):
        return (
            " (it needs a GPU or NCCL, and this node has neither)",
            "Run the script unchanged with CUDA emulated on CPU: `python -m sim up --devices emulated` (NCCL then "
            "runs as gloo; scenario cluster.devices), or give the nodes real GPUs with `--gpus N` (or all).",
        )
    if name.endswith("ModuleNotFoundError") or name.endswith("ImportError"):
        module = (re.search(r"No module named '([^']+)'", message) or [None, ""])[1]
        top = module.split(".")[0]
        pip = PIP_NAMES.get(module) or PIP_NAMES.get(top) or top or "the package"
        return (
            f" (module {top or '?'} missing in the node)",
            f"The node image has torch and its dependencies, not {top or 'this module'}. If it is a third-party "
            f"package, list it in a requirements file (`{pip}`) and pass `--requirements FILE`: a layer with it "
            "is built over the node image. Or run the nodes on your own image, which has it: `--image IMAGE`. If "
            f"{top or 'it'} is your job's own package (a folder beside or above the script), bring the whole "
            "project with `--project-dir DIR` (it goes on PYTHONPATH).",
        )
    if name.endswith("OutOfMemoryError") or "out of memory" in message.lower():
        return (
            " (out of memory)",
            "Use less memory per worker: a smaller batch (with gradient accumulation to keep the effective batch), "
            "activation checkpointing (torch.utils.checkpoint), mixed precision (torch.autocast), fewer workers "
            "per node; for fragmentation, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (`--env`).",
        )
    read_only = "Read-only file system" in message or "Errno 30" in message
    if read_only or (name.endswith("PermissionError") and USER_DIR in text):
        return (
            " (a write into the read-only script folder)",
            f"The script's folder is mounted read-only in every node ({USER_DIR}). Write checkpoints to the shared "
            f"$SIM_CKPT_DIR ({CKPT_DIR}, seen by every node: a resume works on any node) or to a node-local path "
            "(/tmp). `--project-dir DIR` instead runs the job from a writable copy of its project in each node "
            "(node-local, as on a real node).",
        )
    if name.endswith("FileNotFoundError") or "No such file or directory" in message:
        path = (re.search(r"No such file or directory: '([^']+)'", message) or [None, ""])[1]
        if path.startswith((USER_DIR, CKPT_DIR)):
            where = f"{path} is not in the node: only the script's own folder is there ({USER_DIR})."
        elif path.startswith("/"):
            where = f"{path} is a path on your machine, not in the node."
        else:
            where = (
                f"{path or 'The path'} is relative: it resolves against the worker's working directory in the "
                "node, not the script's folder."
            )
        return (
            " (a file missing in the node)",
            f"{where} Bring it into every node: `--mount HOST:CONTAINER` (a data or config folder, read-only "
            "unless :rw) and open it at CONTAINER, or `--project-dir DIR` to run from the project's tree, where "
            "paths relative to the project resolve.",
        )
    return (
        "",
        f"Fix the error at {failure.frame}: run the script once outside the simulator (torchrun --nproc-per-node 2 "
        "on this machine) to see it fail the same way, then `sim up` again.",
    )


# Most fundamental first: a cause before the budget it burned, the budget before what followed.
def _pitfall(rule: Callable[[RunModel], Finding | None]) -> Callable[[RunModel], Diagnosis | None]:
    """A pitfall of the job's own (sim/verdict/pitfalls.py) as a diagnosis."""

    def diagnosis(run: RunModel) -> Diagnosis | None:
        found = rule(run)
        return found and Diagnosis(found.code, found.title, found.cause, found.evidence, found.fix)

    diagnosis.__name__ = rule.__name__
    return diagnosis


# The job's own pitfalls first: a script that resumes its ranks from different points fails whatever else happened.
DIAGNOSES: tuple[Callable[..., Diagnosis | None], ...] = (
    script_error,
    *map(_pitfall, PITFALLS),
    engine_lost,
    name_resolution,
    etcd_without_v2,
    clock_skew,
    shared_tcp_store,
    c10d_store_lost,
    etcd_lost,
    disk_full,
    oom_kill,
    damaged_checkpoint_loaded,
    superseded_round_checkpoint,
    init_peer_lost,
    process_group_timeout,
    nccl_dead_peer,
    loss_jump,
    restart_budget,
    waiting_for_nodes,
    spare_agent_exit,
    late_join_at_end,
    stuck_at_exit,
)

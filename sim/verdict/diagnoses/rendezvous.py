"""The rendezvous and its store: c10d's shared TCP store, a lost store host or etcd, waiting for nodes, a spare's
exit, name resolution, clock skew past the keep-alive, a late join at the end, and the Docker engine gone.

Registered, in order, by registry.py's DIAGNOSES."""

from __future__ import annotations

import re

from sim.core.faultkinds import kind_of
from sim.core.history import AgentRecord, DockerRecord, FaultRecord, Record, RunRecord
from sim.core.nodes import node_order
from sim.verdict.diagnoses.evidence import (
    FROZEN_HANG_S,
    NODE_LOSS_DOCKER,
    Diagnosis,
    _agent_nodes,
    _at,
    _describe,
    _faults_where,
    _first_per_node,
    _line,
    result_of,
)
from sim.verdict.runmodel import AGENT_CONTAINER, RunModel

# The store-sharing opt-out torch 2.13 reads in the agent (dynamic_rendezvous.py).
STORE_OPT_OUT = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


# An agent whose etcd call failed and that exited within this long ended on it (etcd-lost).
ETCD_LOSS_EXIT_S = 15.0


# rendezvous-etcd-v3's words when it gives up on etcd: "(unreachable for 30 s, reconnect_timeout=30)".
RECONNECT_TIMEOUT = re.compile(r"reconnect_timeout=(\d+(?:\.\d+)?)")


# A node lost this long after a round's last join may have joined it (logged its own join) but not got its ranks:
# torch's rank assignment follows the join within milliseconds when every participant is there.
ROUND_ASSIGN_S = 2.0


# A node lost this long before a round's group started may still have been counted in that round.
ROUND_LOSS_S = 15.0


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
        # A peer lost while the group set up its process group holds it too (init-peer-lost): not this premise.
        peer_lost = any(
            d.node != node and AGENT_CONTAINER.match(str(d.node)) and d.action in NODE_LOSS_DOCKER
            for d in run.docker
            if started.t - ROUND_LOSS_S <= d.t <= started.t + quiet
        )
        if not any(t > started.t for t in beats) and quiet > FROZEN_HANG_S and not peer_lost:
            hung.append((started, quiet))
    return hung


def waiting_for_nodes(run: RunModel) -> Diagnosis | None:
    """(c) Agents wait in the rendezvous for more nodes than are live (or reachable)."""
    min_nodes = run.spec_fields.min_nodes
    timeouts = run.agent_events("rdzv_timeout")
    waiting = _waiting_now(run)
    if not timeouts and not waiting:
        return None
    live, lost = _live_nodes(run, until=min(r.t for r in [*timeouts, *waiting]))
    short = isinstance(min_nodes, int) and live is not None and len(live) < min_nodes
    cut_off = _first_per_node(run.agent_events("keepalive_failed")) + _faults_where(run, lambda kind: kind.cuts_links)
    if isinstance(min_nodes, int) and live is not None and not short and not cut_off:
        # The premise is false: enough nodes were live and none was cut off, so the rendezvous did not wait for
        # nodes (a joiner waits for a round the others never come back to: another cause holds them).
        return None
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
            "rdzv_joined",  # it joined a round: no longer waiting for nodes (what holds it is after the round)
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
    skews = [f for f in _faults_where(run, lambda kind: kind.skews_clock) if abs(result_of(f).by or 0) > window]
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
    by = result_of(skew).by or 0
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
            for f in _faults_where(run, lambda kind: kind.rejoins_nodes)
            if node == f.node or (kind_of(f.fault).changes_node_count and node in (result_of(f).joined or ()))
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


# torch's dynamic rendezvous' last call when --rdzv-conf gives none (dynamic_rendezvous.py, RendezvousTimeout).
LAST_CALL_DEFAULT_S = 30


# A last-call wait shorter than this is not worth a diagnosis (the fast profile's is 2 s).
LAST_CALL_NOTABLE_S = 5.0


# What bounds the survivors' wait for a lost node's part of the rank assignment, by backend: the store's own
# timeout. torch's etcd backends hand the agents an EtcdStore (etcd_store.py) built without a timeout, so it takes
# c10d's default store timeout (kDefaultTimeout, Store.hpp: 300 s); no --rdzv-conf key changes it (`timeout` is read
# only by the legacy `etcd` backend's own rendezvous, join_timeout only by the join). c10d's TCPStore takes
# read_timeout (60 s by default).
STORE_TIMEOUT_S = 300


C10D_READ_TIMEOUT_S = 60


def _rdzv_conf_seconds(run: RunModel, key: str, default: float) -> float:
    try:
        return float(run.spec_fields.pairs["rdzv_conf"].get(key, default))
    except (TypeError, ValueError):
        return float(default)


def _rounds(run: RunModel) -> dict[int, list[AgentRecord]]:
    """Each rendezvous round's "has joined round N" records, by round number."""
    rounds: dict[int, list[AgentRecord]] = {}
    for record in run.agent_events("rdzv_joined"):
        if record.round is not None:
            rounds.setdefault(record.round, []).append(record)
    return rounds


def _node_losses(run: RunModel) -> list[tuple[str, Record]]:
    """(node, the record that took it out): faults that lose a node, and Docker's die/kill of a node container."""
    losses = [
        (f.where, f)
        for f in _faults_where(run, lambda kind: kind.loses_node)
        if f.where and AGENT_CONTAINER.match(f.where)
    ]
    losses += [
        (r.node, r)
        for r in run.docker
        if r.action in ("die", "kill")
        and AGENT_CONTAINER.match(str(r.node))
        and not any(node == r.node and abs(f.t - r.t) < 5.0 for node, f in losses)
    ]
    return sorted(losses, key=lambda pair: pair[1].t)


def lost_before_ranks(run: RunModel) -> Diagnosis | None:
    """(t) A node lost after it joined a round and before the round's rank assignment: the round completed with it
    as a participant (its heartbeat was still fresh), and the survivors wait in the rendezvous store for its part of
    torch's rank assignment (api.py, _assign_worker_ranks), until the store's timeout."""
    losses = _node_losses(run)
    if not losses:
        return None
    rounds = _rounds(run)
    for number, joined in sorted(rounds.items()):
        world = max((r.nodes for r in joined if r.nodes is not None), default=None)
        previous = max((r.t for n, rs in rounds.items() if n < number for r in rs), default=float("-inf"))
        last_joined = max(r.t for r in joined)
        # The premise: a node that entered this round's rendezvous and was lost before its rank assignment (before
        # the round completed, or just after it: it may have logged its own join), with no ranks of its own.
        lost = []
        for node, loss in losses:
            if not previous < loss.t <= last_joined + ROUND_ASSIGN_S:
                continue
            entered = [r for r in run.agent_events("rdzv_joining", node=node) if previous < r.t <= loss.t]
            assigned = run.agent_events("rdzv_complete", node=node)
            if entered and not any(entered[-1].t < r.t <= loss.t for r in assigned):
                lost.append((node, loss, entered[-1]))
        gone = {node for node, _, _ in lost}
        # The others of the round that never got their ranks (no "Rendezvous complete for workers" after joining).
        waited = []
        for record in sorted(joined, key=lambda r: node_order(r.node)):
            if record.node in gone:
                continue
            # The agent's own traceback (its store wait ending) reads as a worker's exception in its log.
            news = (*AGENT_NEWS, "rdzv_complete", "rdzv_joining", "exception", "worker_exception")
            after = [r for r in run.agent_events(*news, node=record.node) if r.t > record.t]
            if after and after[0].event in ("rdzv_complete", "group_started", "rdzv_joining"):
                continue
            waited.append((record, after[0] if after else None))
        if lost and waited and (world is None or len(waited) < world):
            return _lost_before_ranks(run, number, world, min(r.t for r in joined), lost, waited)
    return None


def _lost_before_ranks(
    run: RunModel,
    number: int,
    world: int | None,
    completed: float,
    lost: list[tuple[str, Record, AgentRecord]],
    waited: list[tuple[AgentRecord, AgentRecord | None]],
) -> Diagnosis:
    names = ", ".join(node for node, _, _ in lost)
    survivors = ", ".join(r.node for r, _ in waited)
    backend = run.spec_fields.rdzv_backend
    c10d = backend == "c10d"
    limit = _rdzv_conf_seconds(run, "read_timeout", C10D_READ_TIMEOUT_S) if c10d else STORE_TIMEOUT_S
    store = (
        f"c10d's TCPStore, whose waits end after read_timeout ({limit:g} s)"
        if c10d
        else f"torch's EtcdStore in etcd, whose waits end after c10d's default store timeout ({limit:g} s; "
        "no --rdzv-conf key changes it)"
    )
    longest = max((end.t if end else run.t_end) - r.t for r, end in waited)
    ended = [(r, end) for r, end in waited if end is not None]
    outcome = (
        f"; they waited {longest:.0f} s, then their agents failed ({_describe(ended[0][1])}) and the job ended"
        if ended
        else f"; they were still waiting at the run's end, {longest:.0f} s later"
    )
    evidence = []
    for node, loss, entered in lost:
        evidence.append(_line(entered, f"{node} entered the rendezvous"))
        when = "before it completed" if loss.t <= completed else "after it completed, before the rank assignment"
        evidence.append(_line(loss, f"{_describe(loss)}: {node} lost inside round {number}, {when}"))
    for record, end in waited:
        evidence.append(
            _line(
                record,
                f"joined round {number} as rank {record.group_rank} in a world of {world or '?'} nodes, "
                f"{names} counted; no rank assignment after it",
            )  # fmt: skip
        )
        if end is not None:
            evidence.append(_line(end))
    window = _keep_alive_window(run)
    return Diagnosis(
        "lost-before-ranks",
        f"{names} lost between joining round {number} and its rank assignment: {survivors} wait in the store",
        f"{names} joined round {number} of the rendezvous and was lost before the round's rank assignment. torch "
        f"keeps a participant in a round while its heartbeat is younger than keep_alive_interval x "
        f"keep_alive_max_attempt ({window:g} s here), so the round completed with {names} counted (a world of "
        f"{world or '?'} nodes; {len(waited)} came). After a round, torch's agents assign the workers' ranks "
        "through the rendezvous store (api.py, _assign_worker_ranks): each agent writes its role info under "
        "torchelastic/role_info/, the rank-0 agent reads every participant's and writes torchelastic/assigned_ranks/, "
        "and every agent waits for its own. "
        f"Nothing comes for {names}, so {survivors} wait in {store}, start no workers and do not regroup"
        f"{outcome}.",
        evidence,
        "torch cannot notice this loss until the store's wait ends; shorten the window in which it can happen: "
        "a lower last_call_timeout (the round completes that long after its first join, --rdzv-conf "
        "last_call_timeout=2) or running at --max-nodes (the round completes as the last node joins), and a "
        "keep-alive window (keep_alive_interval x keep_alive_max_attempt) short enough that a lost node drops out "
        "of a round before it completes. Or set TORCH_ELASTIC_WORKER_IDENTICAL=1 for the agents (every node runs "
        "the same number of workers): torch then computes the ranks without the store, the workers start, and the "
        "loss shows in init_process_group, bounded by the timeout= the script gives it.",
    )


def last_call_wait(run: RunModel) -> Diagnosis | None:
    """(u) A regroup that waited out torch's last call: with --nnodes MIN:MAX and fewer than MAX nodes, a round
    completes last_call_timeout after its first agent joined it (dynamic_rendezvous.py, _add_to_participants)."""
    min_nodes, max_nodes = run.spec_fields.min_nodes, run.spec_fields.max_nodes
    if run.spec_fields.rdzv_backend == "static":
        return None
    if not (isinstance(min_nodes, int) and isinstance(max_nodes, int) and min_nodes < max_nodes):
        return None  # MIN == MAX: a round completes when the last node joins, no last call
    last_call = _rdzv_conf_seconds(run, "last_call_timeout", LAST_CALL_DEFAULT_S)
    if last_call < LAST_CALL_NOTABLE_S:
        return None
    faults = [f for f in run.faults if not f.kind.degrading and not f.spares_training]
    waits = []
    for fault in faults:
        entered = [r for r in run.agent_events("rdzv_joining") if r.t > fault.t_invoke]
        if not entered:
            continue
        first = entered[0]
        done = [r for r in run.agent_events("rdzv_joined") if r.t > first.t]
        if not done:
            continue
        completed = done[0]
        size = max((r.nodes or 0) for r in done if r.round == completed.round) if completed.round is not None else 0
        waited = completed.t - first.t
        # The premise: fewer than MAX nodes in the round, and a wait as long as the last call (less a poll).
        seen = any(w[2] is completed for w in waits)  # two faults in one regroup: one wait
        if size and size < max_nodes and waited >= last_call - 1.0 and not seen:
            waits.append((fault, first, completed, size, waited))
    if not waits:
        return None
    configured = "last_call_timeout" in run.spec_fields.pairs["rdzv_conf"]
    setting = f"--rdzv-conf last_call_timeout={last_call:g}" if configured else "torch's default, 30 s"
    evidence = []
    for fault, first, completed, size, waited in waits:
        evidence.append(_line(first, f"after {fault.fault} {fault.target or ''}: the first agent entered the "
                              "rendezvous".replace("  ", " ")))  # fmt: skip
        evidence.append(
            _line(
                completed,
                f"round {completed.round} completed {waited:.1f} s later with {size} of at most {max_nodes} nodes",
            )  # fmt: skip
        )
    total = sum(w[4] for w in waits)
    return Diagnosis(
        "last-call-wait",
        f"Regroup slowed by the last call ({last_call:g} s): fewer than --max-nodes {max_nodes} nodes",
        f"The job runs with --nnodes {min_nodes}:{max_nodes} and had fewer than {max_nodes} nodes, so torch's dynamic "
        f"rendezvous completes a round only last_call_timeout ({setting}) after its first agent joined it, waiting "
        f"for more nodes that never came (at --max-nodes it completes as the last one joins). {len(waits)} "
        f"regroup(s) waited so, {total:.0f} s in all, on top of noticing the fault and restarting the workers.",
        evidence,
        f"Lower the last call (--rdzv-conf last_call_timeout=2; torch reads whole seconds), or run at the maximum "
        f"(--nnodes {max_nodes}:{max_nodes}, or as many nodes as --max-nodes) so a round completes as the last node "
        "joins. A shorter last call also narrows the window in which a node lost inside a round is still counted.",
    )

"""Fault verbs of the command line: `sim kill-worker`, `sim pause`, `sim partition`, ...

Each verb checks its input, finds the running cluster, and makes one Nemesis
call (which writes the audit records). `--for DURATION` holds the fault, then
undoes it (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

from sim.cluster import Cluster
from sim.docker import Docker
from sim.errors import ClusterNotFoundError, UsageError
from sim.spec import DEFAULT_NAME

from . import partition as partitions
from .nemesis import ETCD, Nemesis
from .parse import parse_duration, parse_percent, parse_rate, parse_signal

TARGET_HELP = "a node (node0, ...), or random (seeded), store-host, rank0, etcd"


def register(sub: argparse._SubParsersAction) -> dict[str, Callable]:
    def verb(name: str, help: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help, description=help)
        parser.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
        parser.add_argument("--seed", type=int, help="seed for random choices (recorded in the history)")
        return parser

    p = verb("kill-worker", "signal one training worker (SIGKILL by default)")
    p.add_argument("target", nargs="?", default="random", help=TARGET_HELP + " (default random)")
    p.add_argument("--rank", type=int, help="the worker with this global rank, wherever it runs")
    p.add_argument("--local-rank", type=int, help="the worker with this local rank on the target node")
    p.add_argument("--signal", default="KILL", help="KILL, TERM, SEGV, INT, ... (default KILL)")

    p = verb("kill-agent", "signal the torchrun agent (KILL: abrupt; TERM: torchrun's graceful path)")
    p.add_argument("target", help=TARGET_HELP)
    p.add_argument("--signal", default="KILL")

    p = verb("kill", "crash a whole node or etcd at once (docker kill)")
    p.add_argument("target", help=TARGET_HELP)

    p = verb("stop", "preempt a node: SIGTERM, then SIGKILL after a grace period (docker stop -t)")
    p.add_argument("target", help=TARGET_HELP)
    p.add_argument("--grace", default="10s", help="grace period (default 10s)")

    p = verb("restart", "restart a node or etcd with the same hostname (quick rejoin; etcd keeps its data)")
    p.add_argument("target", help=TARGET_HELP)
    p.add_argument("--grace", default="0s", help="grace period before the kill (default 0s)")
    p.add_argument("--downtime", default="0s", help="stay down this long before starting again (default 0s)")

    p = verb("start", "start a node or etcd that was killed or stopped")
    p.add_argument("target", help=TARGET_HELP)

    p = verb("pause", "freeze a node or etcd (every process stops; docker pause)")
    p.add_argument("target", help=TARGET_HELP)
    p.add_argument("--for", dest="duration", help="unpause after this long (e.g. 20s); default: until `sim unpause`")

    p = verb("unpause", "resume a frozen node or etcd")
    p.add_argument("target", help=TARGET_HELP)

    p = verb("partition", "cut the network: groups 'node0,node1|node2,node3', or --isolate/--from-etcd/--from-peers/--one-way")
    p.add_argument("groups", nargs="?", help="groups separated by |, every node in exactly one")
    p.add_argument("--isolate", help="nodes cut off from everyone (etcd included)")
    p.add_argument("--from-etcd", help="nodes cut off from etcd only (control plane)")
    p.add_argument("--from-peers", help="nodes cut off from the other nodes only (data plane)")
    p.add_argument("--one-way", nargs=2, metavar=("FROM", "TO"), help="FROM's packets to TO are dropped; TO->FROM still flows")
    p.add_argument("--for", dest="duration", help="heal after this long; default: until `sim heal`")

    p = verb("heal", "undo one fault by id (see `sim faults`), or every reversible one with --all")
    p.add_argument("fault_id", nargs="?")
    p.add_argument("--all", action="store_true")

    p = verb("netem", "degrade a node's link: --loss, --rate, or --delay/--jitter/--duplicate/--corrupt (kernel netem)")
    p.add_argument("target", help=TARGET_HELP)
    p.add_argument("--loss", help="random packet loss, e.g. 30%% (iptables statistic)")
    p.add_argument("--rate", help="bandwidth, e.g. 1mbit (tc tbf)")
    p.add_argument("--delay", help="e.g. 100ms (needs netem)")
    p.add_argument("--jitter", help="e.g. 20ms, with --delay (needs netem)")
    p.add_argument("--duplicate", help="e.g. 1%% (needs netem)")
    p.add_argument("--corrupt", help="e.g. 1%% (needs netem)")
    p.add_argument("--for", dest="duration", help="clear after this long")

    p = verb("etcd", "etcd faults: kill, restart (keeps data), wipe (restart empty), pause, unpause, isolate")
    p.add_argument("action", choices=["kill", "restart", "wipe", "pause", "unpause", "isolate", "start"])
    p.add_argument("--downtime", default="0s", help="for restart/wipe: stay down this long (default 0s)")
    p.add_argument("--for", dest="duration", help="for pause/isolate: undo after this long")

    p = verb("scale", "add nodes that join the running job, or remove the highest ones")
    p.add_argument("--nodes", type=int, required=True, help="run exactly node0..node{N-1}")
    p.add_argument("--abrupt", action="store_true", help="removed nodes are killed, not stopped")
    p.add_argument("--grace", default="10s", help="grace period for a graceful removal (default 10s)")

    verb("faults", "list the faults now in force")

    chaos = sub.add_parser("chaos", help="run chaos scenario files (sim chaos run FILE | sim chaos list)")
    # The same one-line-error parser class as every other verb.
    chaos_sub = chaos.add_subparsers(dest="chaos_command", metavar="SUBCOMMAND", parser_class=sub._parser_class)
    chaos_sub.required = True
    run = chaos_sub.add_parser("run", help="run a scenario: up, faults, wait, check, report, down; exit 0 when the "
                                           "verdict matches the expectation")
    run.add_argument("file", help="a scenario file, or the name of a shipped one (see `sim chaos list`)")
    run.add_argument("--seed", type=int, help="seed for random choices (default: the file's, else random; recorded)")
    run.add_argument("--backend", help="run on this backend only (default: every backend the scenario names)")
    run.add_argument("--keep", action="store_true", help="keep the cluster afterwards")
    run.add_argument("--cluster", help="use this running cluster instead of starting one")
    chaos_sub.add_parser("list", help="the shipped scenarios, one line each")

    return {"kill-worker": cmd_kill_worker, "kill-agent": cmd_kill_agent, "kill": cmd_kill, "stop": cmd_stop,
            "restart": cmd_restart, "start": cmd_start, "pause": cmd_pause, "unpause": cmd_unpause,
            "partition": cmd_partition, "heal": cmd_heal, "netem": cmd_netem, "etcd": cmd_etcd,
            "scale": cmd_scale, "faults": cmd_faults, "chaos": cmd_chaos}


def _nemesis(args: argparse.Namespace, *, running: bool = True) -> Nemesis:
    """The cluster's nemesis; `running=False` for verbs that bring stopped containers back."""
    docker = Docker()
    docker.ping()
    cluster = Cluster(args.name, docker)
    if running:
        cluster.require_running()
    elif not cluster.containers():
        raise ClusterNotFoundError(f"cluster '{args.name}': not found; `python -m sim ls` lists clusters")
    return Nemesis(cluster, seed=args.seed)


def _report(result: dict) -> int:
    print(json.dumps(result, sort_keys=True))
    return 0


def _hold(duration: str | None, undo: Callable[[], dict]) -> None:
    """Keep a fault for `duration`, then undo it; Ctrl-C undoes it early."""
    if duration is None:
        return
    seconds = parse_duration(duration)
    try:
        time.sleep(seconds)
    finally:
        _report(undo())


def _check_duration(args: argparse.Namespace) -> None:
    # Parse before acting: a bad duration must change nothing.
    if getattr(args, "duration", None) is not None:
        parse_duration(args.duration)


def cmd_kill_worker(args, _):
    sig = parse_signal(args.signal)
    if args.rank is not None and args.local_rank is not None:
        raise UsageError("kill-worker: give --rank (global) or --local-rank (on the target node), not both")
    nemesis = _nemesis(args)
    return _report(nemesis.kill_worker(args.target, rank=args.rank, local_rank=args.local_rank, sig=sig))


def cmd_kill_agent(args, _):
    sig = parse_signal(args.signal)
    return _report(_nemesis(args).kill_agent(args.target, sig=sig))


def cmd_kill(args, _):
    return _report(_nemesis(args).kill_node(args.target))


def cmd_stop(args, _):
    grace = parse_duration(args.grace)
    return _report(_nemesis(args).stop_node(args.target, grace=grace))


def cmd_restart(args, _):
    grace, downtime = parse_duration(args.grace), parse_duration(args.downtime)
    return _report(_nemesis(args).restart_node(args.target, grace=grace, downtime=downtime))


def cmd_start(args, _):
    return _report(_nemesis(args, running=False).start_node(args.target))


def cmd_pause(args, _):
    _check_duration(args)
    nemesis = _nemesis(args)
    result = nemesis.pause(args.target)
    _report(result)
    _hold(args.duration, lambda: nemesis.unpause(result["node"]))
    return 0


def cmd_unpause(args, _):
    return _report(_nemesis(args).unpause(args.target))


def cmd_partition(args, _):
    _check_duration(args)
    nemesis = _nemesis(args)
    nodes = [c.node for c in nemesis.cluster.nodes()]
    has_etcd = any(c.node == ETCD for c in nemesis.cluster.containers())
    split = lambda text: [n.strip() for n in text.split(",")] if text else None  # noqa: E731
    shape = partitions.partition_from_options(
        {"groups": args.groups, "isolate": split(args.isolate), "from_etcd": split(args.from_etcd),
         "from_peers": split(args.from_peers), "one_way": [split(side) for side in args.one_way] if args.one_way else None},
        nodes, has_etcd=has_etcd)
    result = nemesis.partition(shape)
    _report(result)
    _hold(args.duration, lambda: nemesis.heal(result["id"]))
    return 0


def cmd_heal(args, _):
    if bool(args.fault_id) == bool(args.all):
        raise UsageError("heal: give a fault id (see `sim faults`) or --all")
    return _report(_nemesis(args).heal(None if args.all else args.fault_id))


def cmd_netem(args, _):
    _check_duration(args)
    loss = parse_percent(args.loss) if args.loss else None
    rate = parse_rate(args.rate) if args.rate else None
    netem = {"delay_ms": _ms(args.delay), "jitter_ms": _ms(args.jitter),
             "duplicate_pct": parse_percent(args.duplicate) if args.duplicate else None,
             "corrupt_pct": parse_percent(args.corrupt) if args.corrupt else None}
    nemesis = _nemesis(args)
    result = nemesis.link(args.target, loss_pct=loss, rate_bps=rate, netem=netem)
    _report(result)
    _hold(args.duration, lambda: nemesis.heal(f"link-{result['node']}"))
    return 0


def _ms(text: str | None) -> float | None:
    return None if text is None else parse_duration(text) * 1000


def cmd_etcd(args, _):
    _check_duration(args)
    downtime = parse_duration(args.downtime)
    nemesis = _nemesis(args, running=args.action != "start")
    nemesis.resolve(ETCD)  # a clear error when the cluster has no etcd
    if args.action == "kill":
        return _report(nemesis.kill_node(ETCD))
    if args.action == "start":
        return _report(nemesis.start_node(ETCD))
    if args.action == "restart":
        return _report(nemesis.restart_node(ETCD, downtime=downtime))
    if args.action == "wipe":
        return _report(nemesis.wipe_etcd(downtime=downtime))
    if args.action == "unpause":
        return _report(nemesis.unpause(ETCD))
    if args.action == "pause":
        result = nemesis.pause(ETCD)
        _report(result)
        _hold(args.duration, lambda: nemesis.unpause(ETCD))
        return 0
    nodes = [c.node for c in nemesis.cluster.nodes()]
    result = nemesis.partition(partitions.cut_from([ETCD], nodes, nodes + [ETCD]))
    _report(result)
    _hold(args.duration, lambda: nemesis.heal(result["id"]))
    return 0


def cmd_scale(args, _):
    grace = parse_duration(args.grace)
    return _report(_nemesis(args).scale(args.nodes, abrupt=args.abrupt, grace=grace))


def cmd_faults(args, _):
    nemesis = _nemesis(args)
    active = nemesis.active()
    if not active:
        print("no faults in force")
        return 0
    print(f"{'ID':<20} {'FAULT':<10} {'TARGET':<30} SINCE")
    for fault in active:
        since = time.strftime("%H:%M:%S", time.localtime(fault["since"]))
        print(f"{fault['id']:<20} {fault['fault']:<10} {fault['target']:<30} {since}")
    return 0


def cmd_chaos(args, _):
    from .scenario import load_scenario
    from .runner import ScenarioRunner
    from .catalog import find_scenario, shipped_scenarios
    if args.chaos_command == "list":
        for scenario in shipped_scenarios():
            outcomes = ", ".join(f"{b}: {scenario.expect.outcome(b)}" for b in scenario.backends)
            print(f"{scenario.name:<28} {scenario.description}  [{outcomes}]")
        return 0
    scenario = load_scenario(find_scenario(args.file))
    backends = scenario.backends if args.backend is None else (args.backend,)
    docker = Docker()
    docker.ping()
    results = [ScenarioRunner(scenario, backend, docker=docker, seed=args.seed, keep=args.keep,
                              cluster_name=args.cluster).run() for backend in backends]
    for result in results:
        print(result.summary)
    for result in results:
        mark = "PASS" if result.passed else "FAIL"
        print(f"{mark} {result.scenario} [{result.backend}] expected {result.expected}; seed {result.seed}; "
              f"timeline {result.timeline}")
    return 0 if all(r.passed for r in results) else 1

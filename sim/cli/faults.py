"""Fault verbs of the command line: `sim kill-worker`, `sim pause`, `sim partition`, ...

The verbs are generated from the fault catalog (sim.faults.catalog): each checks its input, finds the
running cluster, and makes one Nemesis call (which writes the audit records). `--for DURATION`
holds a reversible fault, then undoes it (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from sim.core.errors import ClusterNotFoundError, UsageError
from sim.core.faultoptions import FLAG, FaultOptions, option_of
from sim.core.parse import parse_duration
from sim.core.paths import ClusterName
from sim.core.spec import DEFAULT_NAME, ENGINES
from sim.engines.docker import Docker
from sim.engines.engine import choose_engine
from sim.faults.catalog import FAULTS, FaultEntry
from sim.faults.nemesis import Nemesis
from sim.faults.targets import ETCD


def register(sub: argparse._SubParsersAction) -> dict[str, Callable]:
    """Add a verb for each fault of the catalog (those sharing a first word, like `sim etcd kill`,
    as one verb with an action), `sim faults` and `sim chaos`; returns verb -> command."""
    commands: dict[str, Callable] = {}
    groups: dict[str, list[FaultEntry]] = {}
    for fault in FAULTS.values():
        groups.setdefault(fault.verb[0], []).append(fault)
    for verb, faults in groups.items():
        if len(faults) == 1 and len(faults[0].verb) == 1:
            for name in _add_fault_verb(sub, faults[0]):
                commands[name] = lambda args, _, fault=faults[0]: _inject(fault, args)
        else:
            _add_group_verb(sub, verb, faults)
            by_action = {fault.verb[1]: fault for fault in faults}
            commands[verb] = lambda args, _, verb=verb, by_action=by_action: _inject(
                _group_action(verb, by_action, args), args
            )

    _verb(sub, "faults", "list the faults now in force")
    commands["faults"] = cmd_faults

    chaos = sub.add_parser("chaos", help="run chaos scenario files (sim chaos run FILE | sim chaos list)")
    # The same one-line-error parser class as every other verb.
    chaos_sub = chaos.add_subparsers(dest="chaos_command", metavar="SUBCOMMAND", parser_class=sub._parser_class)
    chaos_sub.required = True
    run = chaos_sub.add_parser(
        "run",
        help="run a scenario: up, faults, wait, check, report, down; exit 0 when the verdict matches the expectation",
    )
    run.add_argument("file", help="a scenario file, or the name of a shipped one (see `sim chaos list`)")
    run.add_argument("--seed", type=int, help="seed for random choices (default: the file's, else random; recorded)")
    run.add_argument("--backend", help="run on this backend only (default: every backend the scenario names)")
    run.add_argument("--keep", action="store_true", help="keep the cluster afterwards (its faults healed)")
    run.add_argument(
        "--keep-faults", action="store_true", help="with --keep or --cluster: leave the run's faults in force"
    )
    run.add_argument("--cluster", help="use this running cluster instead of starting one")
    run.add_argument("--engine", choices=ENGINES, help="start the cluster on this engine (default: the scenario's)")
    chaos_sub.add_parser("list", help="the shipped scenarios, one line each")
    commands["chaos"] = cmd_chaos
    return commands


def _verb(
    sub: argparse._SubParsersAction, name: str, help: str, description: str | None = None, aliases: tuple[str, ...] = ()
) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help, description=description or help, aliases=aliases)
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
    parser.add_argument("--seed", type=int, help="seed for random choices (recorded in the history)")
    return parser


def _add_fault_verb(sub: argparse._SubParsersAction, fault: FaultEntry) -> tuple[str, ...]:
    """One fault's verb; its names on the command line. A fault whose verb is short for its name (`sim slow`,
    `sim kill`) also answers to the name a scenario step and `sim vet --faults` give it (`sim slow-node`)."""
    names = (fault.verb[0],) if fault.name == fault.verb[0] else (fault.verb[0], fault.name)
    parser = _verb(sub, names[0], fault.help, aliases=names[1:])
    for f in fault.fields:
        _add_option(parser, f)
    if fault.reversible:
        parser.add_argument(
            "--for", dest="duration", help=f"undo after this long, e.g. 20s (default: until `sim {fault.undo_verb}`)"
        )
    return names


def _add_group_verb(sub: argparse._SubParsersAction, verb: str, faults: list[FaultEntry]) -> None:
    """One verb whose first argument picks the fault: `sim etcd restart --downtime 5s`. Each option
    is offered once, saying which actions take it; given to another action, it is an error."""
    actions = [fault.verb[1] for fault in faults]
    parser = _verb(
        sub,
        verb,
        f"{verb} faults: {', '.join(actions)}",
        f"{verb} faults: " + "; ".join(f"{fault.verb[1]}: {fault.help}" for fault in faults),
    )
    parser.add_argument("action", choices=actions)
    taken_by: dict[str, tuple[dataclasses.Field, list[str]]] = {}
    for fault in faults:
        for f in fault.fields:
            taken_by.setdefault(f.name, (f, []))[1].append(fault.verb[1])
    for f, takers in taken_by.values():
        _add_option(parser, f, takers=takers)
    reversible = [fault.verb[1] for fault in faults if fault.reversible]
    if reversible:
        parser.add_argument("--for", dest="duration", help=f"for {', '.join(reversible)}: undo after this long")


def _group_action(verb: str, by_action: dict[str, FaultEntry], args: argparse.Namespace) -> FaultEntry:
    """The fault a group verb's action names, refusing an option that action does not take
    (`sim etcd kill --downtime 5s` would otherwise drop the downtime without a word)."""

    def options_of(fault: FaultEntry) -> set[str]:
        return {f.name for f in fault.fields} | ({"duration"} if fault.reversible else set())

    fault = by_action[args.action]
    for name in sorted(set().union(*map(options_of, by_action.values())) - options_of(fault)):
        if getattr(args, name, None) is not None:
            spelt = "--for" if name == "duration" else _flag(name)
            takers = [action for action, other in by_action.items() if name in options_of(other)]
            raise UsageError(
                f"sim {verb} {args.action} {spelt}: {args.action} takes no {spelt}; it is for "
                f"{verb} {', '.join(takers)} (e.g. `sim {verb} {takers[0]} {spelt} 5s`), or drop it"
            )
    return fault


def _add_option(parser: argparse.ArgumentParser, f: dataclasses.Field, takers: list[str] | None = None) -> None:
    """The CLI argument of one option; default None (not given) so the catalog's default applies."""
    option = option_of(f)
    shown = f.default is not dataclasses.MISSING and f.default is not None and not isinstance(f.default, bool)
    help = option.help + (f" (default {option.kind.show(f.default)})" if shown else "")
    if takers:
        help = f"for {', '.join(takers)}: {help}"
    settings: dict[str, Any] = {"help": help.replace("%", "%%")}
    if option.kind is FLAG:
        settings.update(action="store_true", default=None)
    else:
        settings.update(metavar=option.metavar, nargs=option.kind.nargs)
    if option.positional:
        if f.default is not dataclasses.MISSING:
            settings["nargs"] = "?"
        parser.add_argument(f.name, **settings)
    else:
        parser.add_argument(_flag(f.name), dest=f.name, required=f.default is dataclasses.MISSING, **settings)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _options(fault: FaultEntry, args: argparse.Namespace) -> FaultOptions:
    given = {}
    for f in fault.fields:
        value = getattr(args, f.name)
        if value is not None:
            spelt = f.name if option_of(f).positional else _flag(f.name)
            given[f.name] = _checked(spelt, option_of(f).kind.parse, value)
    return fault.make_options(given)


def _checked(spelt: str, parse: Callable[[Any], Any], value: Any) -> Any:
    try:
        return parse(value)
    except UsageError as error:
        raise UsageError(f"{spelt}: {error}") from None


def _inject(fault: FaultEntry, args: argparse.Namespace) -> int:
    inject(fault, args, report=_report)
    return 0


def inject(fault: FaultEntry, args: argparse.Namespace, report: Callable[[dict], None] = lambda result: None) -> dict:
    """Check the input, then one Nemesis call; with --for, hold the fault and undo it (also on Ctrl-C).
    Returns the audited result (a held fault's undo under "ended"); `report` sees each as it comes.
    The verbs and the Chaos Toolkit actions (sim.cli.toolkit) both inject through here."""
    # Everything is parsed before acting: bad input must change nothing.
    options = _options(fault, args)
    hold_s = None if getattr(args, "duration", None) is None else _checked("--for", parse_duration, args.duration)
    nemesis = _nemesis(args, running=fault.needs_running)
    if fault.needs_etcd:
        nemesis.resolve(ETCD)  # a clear error when the cluster has no etcd
    result = fault.invoke(nemesis, options)
    report(result)
    if hold_s is None or fault.undo is None:
        return result
    ended = None
    try:
        time.sleep(hold_s)
    finally:
        ended = fault.end_hold(nemesis, result)
        report(ended)
    return {**result, "ended": ended}


def _nemesis(args: argparse.Namespace, *, running: bool = True) -> Nemesis:
    """The cluster's nemesis; `running=False` for verbs that bring stopped containers back."""
    docker = Docker()
    docker.ping()
    # A Swarm stack's nodes start and stop through their services (sim/engines/swarm.py).
    name = ClusterName(args.name, source="cluster")  # checked once, here
    cluster = choose_engine(docker, name=name).cluster(name)
    if running:
        cluster.require_running()
    elif not cluster.containers():
        raise ClusterNotFoundError(f"cluster '{args.name}': not found; `python -m sim ls` lists clusters")
    return Nemesis(cluster, seed=args.seed)


def _report(result: dict) -> None:
    print(json.dumps(result, sort_keys=True))


def cmd_faults(args, _):
    nemesis = _nemesis(args)
    active = nemesis.active()
    if not active:
        print("no faults in force")
        return 0
    print(f"{'ID':<20} {'FAULT':<10} {'TARGET':<30} SINCE")
    for fault in active:
        since = time.strftime("%H:%M:%S", time.localtime(fault.since))
        # An intent whose call has not finished: acting now, or interrupted (heal undoes it as if it acted).
        intent = "  (recorded before it acted; no outcome yet)" if fault.acting else ""
        print(f"{fault.id:<20} {fault.fault:<10} {fault.target:<30} {since}{intent}")
    return 0


def cmd_chaos(args, _):
    from sim.scenarios.runner import run_scenario
    from sim.scenarios.scenario import load_scenario
    from sim.scenarios.shipped import find_scenario, shipped_scenarios

    if args.chaos_command == "list":
        for scenario in shipped_scenarios():
            outcomes = ", ".join(f"{b}: {scenario.expect.outcome(b)}" for b in scenario.backends)
            print(f"{scenario.name:<28} {scenario.description}  [{outcomes}]")
        return 0
    scenario = load_scenario(find_scenario(args.file))  # a bad file is reported before Docker is asked
    docker = Docker()
    docker.ping()
    results = run_scenario(
        scenario,
        args.backend,
        docker=docker,
        seed=args.seed,
        keep=args.keep,
        keep_faults=args.keep_faults,
        cluster_name=args.cluster,
        engine=args.engine,
    )
    for result in results:
        print(result.summary)
    for result in results:
        mark = "PASS" if result.passed else "CANNOT TELL" if result.verdict.undetermined else "FAIL"
        print(
            f"{mark} {result.scenario} [{result.backend}] expected {result.expected}; seed {result.seed}; "
            f"timeline {result.timeline}"
        )
    return 0 if all(r.passed for r in results) else 1

"""`python -m sim ...`: the command line. Thin: parse, call the core, print.

Every SimError becomes one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sim.core.capabilities import Placement
from sim.core.errors import DockerUnavailableError, SimError, UsageError
from sim.core.paths import ClusterName, cache_home, state_home
from sim.core.spec import (
    DEFAULT_NAME,
    DEFAULT_PIDS,
    DEVICE_MODES,
    ENGINES,
    FAILURE_TIMINGS,
    RDZV_BACKENDS,
    spec_from_options,
)
from sim.core.wait import wait_for
from sim.engines import cluster as cluster_mod
from sim.engines.docker import Docker
from sim.engines.engine import choose_engine


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that says where to look."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """The options that shape the job, one definition shared by `sim up` and `sim vet`: nodes, backend,
    devices, environment. A new job option is added here, and both commands take it."""
    parser.add_argument("--nodes", type=int, default=4, help="node containers to start (default 4)")
    parser.add_argument("--min-nodes", type=int, help="torchrun --nnodes MIN (default 1)")
    parser.add_argument("--max-nodes", type=int, help="torchrun --nnodes :MAX (default --nodes)")
    parser.add_argument("--nproc-per-node", type=int, help="workers per node (default 2)")
    parser.add_argument("--max-restarts", type=int, help="torchrun --max-restarts, per agent (default 3)")
    parser.add_argument(
        "--monitor-interval", type=float, help="torchrun --monitor-interval in seconds (default torch's)"
    )
    parser.add_argument(
        "--rdzv-backend",
        help=f"one of {', '.join(RDZV_BACKENDS)} (default etcd-v2; c10d uses node0 as "
        "the endpoint; etcd-v3 is rendezvous-etcd-v3/, on an etcd without the v2 API)",
    )
    parser.add_argument(
        "--etcd-version",
        help="the etcd server: 3.4 (with the v2 API torch's etcd backends need) or 3.5 "
        "(without it); default 3.5 for etcd-v3, else 3.4",
    )
    parser.add_argument("--rdzv-conf", help="torchrun --rdzv-conf, passed unchanged: k=v,k2=v2")
    parser.add_argument("--script", help="a torchrun training script on this machine (default: the shipped trainer)")
    parser.add_argument(
        "--project-dir",
        metavar="DIR",
        help="the job's whole tree, copied into every node (writable, on PYTHONPATH, the working folder); "
        "default: the script's git root, else its folder; --script may then be relative to it",
    )
    parser.add_argument(
        "--mount",
        dest="mounts",
        action="append",
        metavar="HOST:CONTAINER[:rw]",
        help="a host file or folder in every node, read-only unless :rw (repeatable), e.g. ./data:/data",
    )
    parser.add_argument(
        "--requirements",
        metavar="FILE",
        help="pip requirements installed in an image layer over the node image (cached by content; "
        "default: [tool.elastic-sim] requirements in the project's pyproject.toml)",
    )
    parser.add_argument(
        "--image",
        metavar="IMAGE",
        help="run the nodes on your own image (with its own Python and torch); elastic-sim adds a thin layer",
    )
    parser.add_argument(
        "--env",
        action="append",
        metavar="KEY=VALUE",
        help="extra environment for every node's agent and workers (repeatable); its values show as *** "
        "in histories, reports and saved logs",
    )
    parser.add_argument(
        "--env-show",
        action="store_true",
        default=None,
        help="show the --env values as they are in histories, reports and saved logs (not ***)",
    )
    parser.add_argument("--gpus", help="GPUs per node: none, all or a number (default none)")
    parser.add_argument(
        "--devices",
        choices=DEVICE_MODES,
        help="emulated: CUDA code runs on CPU and NCCL as gloo in the workers (default without --gpus); "
        "gpu: torch as it is (default with --gpus)",
    )
    parser.add_argument(
        "--failure-timing",
        choices=FAILURE_TIMINGS,
        help="under emulation, a collective whose peer is gone: nccl (default) blocks until the process "
        "group's timeout, then aborts, as NCCL's watchdog does; gloo fails it at once",
    )
    parser.add_argument(
        "--memory",
        help="each node's memory limit, e.g. 2g (no swap), or none for no limit (default: an equal share of this "
        "machine's memory less 1 GiB among --max-nodes, at least what a node needs)",
    )
    parser.add_argument("--pids", type=int, help=f"each node's pids limit, threads included (default {DEFAULT_PIDS})")
    parser.add_argument(
        "--ckpt-size", help="make /ckpt a shared tmpfs of this size, e.g. 64m (a disk fill-disk can fill)"
    )
    parser.add_argument(
        "--no-instrument",
        dest="instrument",
        action="store_false",
        help="no optimizer-step and collective hooks in the workers (they record progress of any script)",
    )
    parser.add_argument(
        "--progress-regex",
        metavar="REGEX",
        help=r"read step and loss from the script's own log lines, e.g. 'step (?P<step>\d+) loss (?P<loss>[\d.]+)'",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        help="compose (default: this machine) or swarm (a Swarm stack; made here if the engine is in none)",
    )
    parser.add_argument(
        "--placement",
        choices=["spread", "packed"],
        default="spread",
        help="swarm: node i on host i mod H (spread, default) or hosts filled in order (packed)",
    )
    parser.add_argument("--ckpt-nfs", metavar="SERVER:/EXPORT", help="swarm: the checkpoint volume on NFS (many hosts)")
    parser.add_argument(
        "--ckpt-dir",
        metavar="DIR",
        help="swarm: the checkpoint volume is this folder, one shared file system at the same path on every host",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sim", description="elastic-sim: a local cluster simulator for PyTorch elastic training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    up = sub.add_parser(
        "up",
        help="build images if needed, start a cluster, follow the job until it ends",
        description="Start a cluster and follow the job until it ends, then print its verdict. "
        "Script arguments go after `--`, e.g. `sim up -- --steps 50` (the shipped "
        "trainer keeps its other defaults).",
    )
    add_job_options(up)
    up.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
    up.add_argument("--detach", action="store_true", help="return once training has started instead of following it")
    up.add_argument(
        "--verbose",
        action="store_true",
        help="follow the raw container logs (torch's INFO stream, every script line) instead of the compact view",
    )
    up.add_argument("--keep", action="store_true", help="keep a failed cluster for debugging instead of removing it")
    up.add_argument(
        "--replace",
        action="store_true",
        help="remove a cluster that already holds --name (also one another SIM_HOME made) instead of refusing",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=cluster_mod.DEFAULT_START_TIMEOUT,
        help="seconds to wait for the first training step (default 300)",
    )

    vet = sub.add_parser(
        "vet",
        help="put your job through a gauntlet of faults, one after another, and score each (a scorecard)",
        description="Start the job, wait until it trains steadily, then strike it with one fault after another, "
        "each once it has recovered from the one before, and score each: survived, failed (with the diagnosis and "
        "its fix) or not applicable; two clusters run at once, each with its share of the faults "
        "(--parallel). Takes `sim up`'s job options (defaults here: 3 nodes x 1 worker, the fast "
        "rendezvous profile, 30 restarts). Writes vet.json and vet.html; exits 0 only when every fault that "
        "should be survived was. Defaults may live in pyproject.toml [tool.elastic-sim]: script, args, nodes, "
        "faults. Script arguments go after `--`.",
    )
    vet.add_argument("vet_script", nargs="?", metavar="SCRIPT", help="your torchrun training script")
    add_job_options(vet)
    vet.set_defaults(nodes=None)
    vet.add_argument("--faults", metavar="A,B,C", help="the kinds to run, in order (default: the whole gauntlet)")
    vet.add_argument("--quick", action="store_true", help="the five most telling kinds only")
    vet.add_argument("--junit", metavar="FILE", help="also write JUnit XML: one test case per fault")
    vet.add_argument("--out", metavar="DIR", default=".", help="where vet.json and vet.html go (default .)")
    vet.add_argument("--name", default="vet", help="cluster name (default vet)")
    vet.add_argument("--keep", action="store_true", help="keep the clusters for debugging instead of removing them")
    vet.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="clusters at once, each with its share of the faults (default 2; 1 on a swarm; 1: one after another)",
    )
    vet.add_argument(
        "--forecast", action="store_true", help="also forecast the job at scale (`sim forecast`) into vet.json/.html"
    )

    down = sub.add_parser("down", help="remove a cluster (containers, network, volumes), keeping its logs")
    _cluster_name(down, default=None)
    down.add_argument(
        "--all", action="store_true", help="remove every elastic-sim cluster this SIM_HOME made on this host"
    )

    sub.add_parser("ls", help="list clusters")

    status = sub.add_parser("status", help="per node: container, agent, workers, round, world size, restarts, step")
    _cluster_name(status, default=DEFAULT_NAME)
    status.add_argument("--watch", action="store_true", help="refresh every 2 s until Ctrl-C")

    report = sub.add_parser("report", help="check a run's history: verdict, recovery times, timeline picture")
    report.add_argument("run", nargs="?", help="a run folder, run name, or cluster name (default: the newest run)")
    report.add_argument("--name", dest="name_flag", metavar="NAME", help="the newest run of this cluster")
    report.add_argument(
        "--expect",
        choices=["recovers", "fails", "hangs"],
        help="the outcome the run should have (default: its scenario's, else recovers)",
    )

    logs = sub.add_parser("logs", help="container logs, prefixed and colored per node (docker compose logs)")
    logs.add_argument(
        "words",
        nargs="*",
        metavar="[NAME] [NODE]",
        help=f"the cluster (default {DEFAULT_NAME}) and one node (default all); one word is a node of the "
        "cluster if it has one of that name, else a cluster, as `sim status NAME` takes it",
    )
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--name", dest="name_flag", metavar="NAME", help=f"cluster name (default {DEFAULT_NAME})")

    doctor = sub.add_parser(
        "doctor",
        help="check Docker, Compose v2, images, kernel features for faults, GPU runtime, "
        "and the privilege audit of a rendered (or a running) cluster",
    )
    _cluster_name(doctor, default=None, help="also audit this running cluster's containers")
    doctor.add_argument("--image", metavar="IMAGE", help="which faults and checks your own image (--image) supports")
    sub.add_parser("build", help="build the node and etcd images (cached by content)")
    swarm = sub.add_parser("swarm", help="the engines of a multi-host swarm's hosts (add-host, remove-host, hosts)")
    swarm_sub = swarm.add_subparsers(dest="swarm_command", metavar="SUBCOMMAND", parser_class=_Parser)
    swarm_sub.required = True
    add_host = swarm_sub.add_parser("add-host", help="register a swarm host's engine (as `docker node ls` names it)")
    add_host.add_argument("host")
    add_host.add_argument("--docker-host", metavar="ADDRESS", help="ssh://USER@HOST, tcp://HOST:2376 or unix:///PATH")
    add_host.add_argument("--context", help="a Docker context instead of an address (`docker context ls`)")
    add_host.add_argument("--tls-ca", metavar="FILE", help="tcp://: the CA that signed the engine's certificate")
    add_host.add_argument("--tls-cert", metavar="FILE", help="tcp://: this client's certificate")
    add_host.add_argument("--tls-key", metavar="FILE", help="tcp://: this client's key")
    add_host.add_argument("--no-check", action="store_true", help="register without asking the engine its version")
    add_host.add_argument(
        "--insecure", action="store_true", help="tcp:// without --tls-ca: an engine that is not verified"
    )
    swarm_sub.add_parser("remove-host", help="forget a swarm host's engine").add_argument("host")
    swarm_sub.add_parser("hosts", help="each swarm host and the engine sim reaches it by")
    _add_export(sub, up)
    _add_forecast(sub)
    _add_tune(sub)
    from sim.cli.faults import register as register_faults

    COMMANDS.update(register_faults(sub))
    return parser


def _cluster_name(parser: argparse.ArgumentParser, *, default: str | None, help: str | None = None) -> None:
    """A command that names one cluster takes it as every command does, `--name NAME`, or as its one word."""
    text = help or f"cluster name (default {DEFAULT_NAME})"
    parser.add_argument("name", nargs="?", default=None, help=text)
    parser.add_argument("--name", dest="name_flag", metavar="NAME", help=text)
    parser.set_defaults(name_default=default)


def _resolve_cluster_name(args: argparse.Namespace) -> None:
    """`sim status h2` and `sim status --name h2` are one command; two different names are refused."""
    flag = getattr(args, "name_flag", None)
    field = "run" if args.command == "report" else "name"
    given = getattr(args, field, None)
    if flag is not None and given is not None and flag != given:
        raise UsageError(f"cluster name given twice ({given!r} and --name {flag!r}); give it once")
    value = flag if flag is not None else given
    if value is None and field == "name":
        value = getattr(args, "name_default", None)
    if value is not None and field == "name":  # the cluster name, made once here and passed down as it is
        value = ClusterName(value, source="cluster")
    setattr(args, field, value)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` belongs to the training script, untouched.
    script_args: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    if script_args is not None and args.command not in ("up", "export", "vet", "tune"):
        print(
            f"sim {args.command}: error: arguments after `--` are only for `sim up`, `sim vet`, `sim tune` and "
            "`sim export`",
            file=sys.stderr,
        )
        return 2
    interrupt_on_termination()
    try:
        if hasattr(args, "name_flag"):
            _resolve_cluster_name(args)
        check_environment(os.environ)
        return COMMANDS[args.command](args, script_args)
    except SimError as error:
        print(f"sim {args.command}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"sim {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `sim report | head`: the reader left; that is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def interrupt_on_termination() -> None:
    """SIGTERM (`kill`, a CI timeout) and SIGHUP (the terminal closed) take the Ctrl-C path in every
    command: pending undos run, what `up` made is removed, a held fault is healed."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup's choice is kept
            signal.signal(signum, _interrupted)


def _docker() -> Docker:
    return Docker()


# What the environment may say, checked before any command acts (docker-py reads DOCKER_HOST itself,
# but its error for a malformed one blames the engine).
_IMAGE_REF = re.compile(
    r"^[a-z0-9][a-z0-9._/-]*(:[0-9]+/[a-z0-9._/-]+)?(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(@sha256:[0-9a-f]{64})?$"
)
_ENVIRONMENT_FORMATS = {  # variable: (pattern, what it must be, an example)
    "SIM_BASE_IMAGE": (_IMAGE_REF, "an image reference", "debian-python:bookworm"),
    "SIM_DEBIAN_SUITE": (re.compile(r"^[a-z][a-z0-9-]*$"), "a Debian suite name", "bookworm"),
    "SIM_DEBIAN_MIRROR": (re.compile(r"^(https?|file|ftp)://\S+$"), "a mirror URL", "http://deb.debian.org/debian"),
    "SIM_SESSION": (re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"), "a label value", "pytest-1a2b"),
    "DOCKER_HOST": (re.compile(r"^(unix|tcp|ssh|npipe|fd|https?)://\S*$"), "a URL", "unix:///var/run/docker.sock"),
}


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse a malformed setting of the environment, naming the variable and the fix, before anything acts."""
    for variable, (pattern, what, example) in _ENVIRONMENT_FORMATS.items():
        value = environ.get(variable)
        if value and not pattern.fullmatch(value):
            raise UsageError(f"{variable} {value!r}: not {what}; set it to {what} such as {example}, or unset it")
    for variable, folder in (("SIM_HOME", state_home()), ("SIM_CACHE", cache_home())):
        # The first part of the path that exists must be a folder: `mkdir -p` goes on from there.
        existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("/"))
        if not existing.is_dir():
            raise UsageError(
                f"{variable} '{folder}': {existing} is a file, not a folder; point {variable} at a folder, or unset it"
            )


def check_start_timeout(seconds: float) -> None:
    if not 0 < seconds < math.inf:
        raise UsageError(
            f"--timeout {seconds:g}: must be a finite number of seconds above zero; "
            f"use e.g. --timeout {cluster_mod.DEFAULT_START_TIMEOUT:g}"
        )


def cmd_up(args: argparse.Namespace, script_args: list[str] | None) -> int:
    spec = spec_from_options(vars(args), script_args)
    check_start_timeout(args.timeout)  # nothing is made before every input is checked
    engine = choose_engine(_docker(), spec=spec)
    placement = Placement(args.placement, args.ckpt_nfs, args.ckpt_dir)  # refused first by an engine without it
    cluster = engine.up(spec, placement=placement, keep=args.keep, timeout=args.timeout, replace=args.replace)
    cluster.release()  # the user's now: `up` ending is not a leak
    name = spec.name
    flag = "" if name == DEFAULT_NAME else f" {name}"
    print(
        f"cluster '{name}' is training: {spec.nodes} nodes x {spec.nproc_per_node} workers, "
        f"{spec.rdzv_backend} rendezvous{f' on etcd {spec.etcd_server_version}' if spec.uses_etcd else ''}, "
        f"nnodes {spec.min_nodes}:{spec.max_nodes}"
    )
    print(f"  {spec.devices_line}")
    print(f"  {spec.limits_line}")
    print(f"  compose file: {cluster.compose_file}")
    print(
        f"  logs:         `python -m sim logs{' --name ' + name if flag else ''} -f`; "
        f"saved to {cluster.run_dir}/logs on down"
    )
    print(
        f"  next:         python -m sim status{flag}   |   docker compose -p {name} ps   |   python -m sim down{flag}"
    )
    if args.detach:
        return 0
    from sim.cli.logs import follow_job
    from sim.verdict.checkers import RunSpec
    from sim.verdict.runfolder import report_run

    print("following the job until it ends (Ctrl-C stops following; the cluster keeps running)", flush=True)
    try:
        # A job that cannot finish (an agent gave up, the rest wait in vain) ends the following too.
        ended = follow_job(cluster, verbose=args.verbose, hang_s=RunSpec.hang_s)
        print(ended.text, flush=True)
    except KeyboardInterrupt:
        print(f"\nstopped following; cluster '{name}' is still running (`python -m sim down{flag}` removes it)")
        return 0
    except DockerUnavailableError as error:
        raise DockerUnavailableError(
            f"{error}. The engine stopped under the run, and cluster '{name}' with it; once the engine is back, "
            f"`python -m sim report {cluster.run_dir}` shows what was recorded and `python -m sim down{flag}` "
            "removes what is left"
        ) from None
    _save_logs(cluster)
    verdict, summary = report_run(cluster.run_dir, stuck=ended.stuck)
    print(summary)
    if ended.stuck is not None:
        print(
            f"cluster '{name}' stays as it is (its other nodes still wait) for `sim report` and `sim logs`; "
            f"`python -m sim down{flag}` removes it"
        )
        return 1
    print(f"the stopped cluster stays for `sim report` and `sim logs`; `python -m sim down{flag}` removes it")
    return 0 if verdict.valid else 1


def _save_logs(cluster) -> None:
    """The nodes' logs into the run folder now (`down` saves them again, whole): the diagnoses quote the script's
    own last lines from them, in this verdict and in a later `sim report`."""
    try:
        cluster.save_logs()
    except (SimError, OSError) as error:
        print(f"(the nodes' logs could not be saved for the report: {error})", file=sys.stderr)


def cmd_vet(args: argparse.Namespace, script_args: list[str] | None) -> int:
    from sim.vet.gauntlet import DEFAULT_GAUNTLET, cluster_count, prepare, run_vet, scorecard, write_outputs

    if args.placement != "spread" or args.ckpt_nfs or args.ckpt_dir:
        raise UsageError(
            "sim vet runs its clusters on one host (this engine, or a one-host swarm with --engine swarm); "
            "drop --placement, --ckpt-nfs and --ckpt-dir"
        )
    options, script_args, faults = vet_options(vars(args), script_args, read_tool_config(Path.cwd()))
    spec, kinds = prepare(options, script_args, faults, args.quick)  # every input checked before anything starts
    parallel = cluster_count(args.parallel, spec)
    whole = " (the whole gauntlet)" if kinds == DEFAULT_GAUNTLET else ""
    print(f"sim vet: {len(kinds)} fault kind(s){whole}: {', '.join(kinds)}", flush=True)
    rates = forecast_rates(None, read_tool_config(Path.cwd())) if args.forecast else None
    vet, _ = run_vet(spec, kinds, chosen=faults is not None, docker=_docker(), keep=args.keep, parallel=parallel)
    made = vet_forecast(vet, rates) if rates is not None else None
    files = write_outputs(vet, Path(args.out), Path(args.junit) if args.junit else None, forecast=made)
    print(scorecard(vet))
    if made is not None:
        from sim.vet.forecast import render

        print(render(made))
    print("  " + "   ".join(f"{kind}: {path}" for kind, path in files.items()))
    return 0 if vet.passed else 1


TOOL_KEYS = ("script", "args", "nodes", "faults", "mtbf")


def read_tool_config(folder: Path) -> dict:
    """`[tool.elastic-sim]` of the pyproject.toml in `folder` (none: empty), its keys checked."""
    import tomllib

    path = folder / "pyproject.toml"
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{path}: not valid TOML ({error}); fix the file or move it aside") from None
    table = data.get("tool", {}).get("elastic-sim", {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.elastic-sim] must be a table of {', '.join(TOOL_KEYS)}")
    for key, value in table.items():
        if key not in TOOL_KEYS:
            raise UsageError(f"{path}: [tool.elastic-sim] {key}: unknown key; use some of {', '.join(TOOL_KEYS)}")
        ok = {
            "script": isinstance(value, str),
            "args": isinstance(value, list) and all(isinstance(v, str) for v in value),
            "nodes": isinstance(value, int) and not isinstance(value, bool),
            "faults": isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
            "mtbf": isinstance(value, dict),
        }[key]
        if not ok:
            example = {
                "script": '"train.py"',
                "args": '["--epochs", "5"]',
                "nodes": "3",
                "faults": '["kill-worker"]',
                "mtbf": '{kill-node = "200d"}',
            }
            raise UsageError(f"{path}: [tool.elastic-sim] {key} = {value!r}: use e.g. {key} = {example[key]}")
    if "script" in table:
        table["script"] = str(folder / table["script"])
    return table


def vet_options(
    options: Mapping[str, object], script_args: list[str] | None, tool: Mapping[str, object]
) -> tuple[dict, list[str] | None, str | None]:
    """The job options, script args and --faults of `sim vet`: the command line over pyproject.toml's
    [tool.elastic-sim] over the vet's defaults."""
    merged = dict(options)
    merged["script"] = options.get("vet_script") or options.get("script") or tool.get("script")
    if not merged["script"]:
        raise UsageError("sim vet: no script; give one (`sim vet train.py`) or set script in [tool.elastic-sim]")
    if merged.get("nodes") is None and "nodes" in tool:
        merged["nodes"] = tool["nodes"]
    if script_args is None and "args" in tool:
        script_args = list(tool["args"])
    faults = options.get("faults")
    if faults is None and "faults" in tool and not options.get("quick"):
        value = tool["faults"]
        faults = value if isinstance(value, str) else ",".join(value)
    return merged, script_args, faults


def cmd_down(args: argparse.Namespace, _: list[str] | None) -> int:
    docker = _docker()
    docker.ping()
    if args.all and args.name:
        raise UsageError("down: give a cluster name or --all, not both")
    names = cluster_mod.list_clusters(docker, owned=True) if args.all else [args.name or DEFAULT_NAME]
    for name in names:
        engine = choose_engine(docker, name=name)
        cluster = engine.cluster(name)
        if not engine.exists(cluster):
            if args.all:
                continue
            raise UsageError(f"cluster '{name}': not found; `python -m sim ls` lists clusters")
        logs_at = cluster.run_dir / "logs"
        removed = engine.down(cluster)
        print(
            f"removed cluster '{name}': {removed['containers']} containers, {removed['networks']} networks, "
            f"{removed['volumes']} volumes; logs kept in {logs_at}"
        )
    if args.all and not names:
        print("no clusters")
    if args.all:
        _print_not_swept(docker)
    return 0


def _print_not_swept(docker: Docker) -> None:
    """What `down --all` left alone: clusters of another state home or host, and labels that name no cluster."""
    found = cluster_mod.labelled_clusters(docker)
    bad = sorted(name for name in found if not cluster_mod.valid_name(name))
    others = sorted(n for n, owners in found.items() if n not in bad and owners != {cluster_mod.labels.owner()})
    if others:
        print(
            f"left {len(others)} cluster(s) of another SIM_HOME or host: {', '.join(others)} "
            f"(`python -m sim down NAME` removes one by name)"
        )
    if bad:
        print(f"ignored {len(bad)} label(s) {cluster_mod.labels.CLUSTER} that are no cluster name: {bad!r}")


def cmd_ls(args: argparse.Namespace, _: list[str] | None) -> int:
    docker = _docker()
    docker.ping()
    names = cluster_mod.list_clusters(docker)
    if not names:
        print("no clusters (start one with `python -m sim up --nodes 4`)")
        return 0
    print(f"{'NAME':<24} {'NODES':<14} {'ETCD':<10} {'RUN':<22} NOTE")
    leftovers = []
    for name in names:
        cluster = cluster_mod.Cluster(name, docker)
        infos = cluster.containers()
        nodes = [c for c in infos if c.role == "node"]
        running = sum(c.state == "running" for c in nodes)
        etcd = next((c.state for c in infos if c.role == "etcd"), "-")
        run_id = next((c.run_id for c in infos if c.run_id), None) or cluster.run_id  # labels first: the truth
        reason = cluster.leftover_reason(infos)
        if reason:
            leftovers.append(name)
        note = f"leftover? {reason}" if reason else ""
        print(f"{name:<24} {f'{running}/{len(nodes)} running':<14} {etcd:<10} {run_id or '-':<22} {note}".rstrip())
    if leftovers:
        print(
            f"{len(leftovers)} look left behind; remove with `python -m sim down {leftovers[0]}` "
            "(each by name; `python -m sim down --all` removes every cluster)"
        )
    return 0


def cmd_status(args: argparse.Namespace, _: list[str] | None) -> int:
    from sim.cli.status import StatusWatch, cluster_status, format_status

    docker = _docker()
    docker.ping()
    name = args.name  # a ClusterName: made once where the command line came in (_resolve_cluster_name)
    cluster = choose_engine(docker, name=name).cluster(name)  # a swarm's tasks on every host
    if not cluster.containers():
        raise UsageError(f"cluster '{args.name}': not found; `python -m sim ls` lists clusters")
    if not args.watch:
        print(format_status(cluster_status(cluster)))
        spec = cluster.spec
        if spec is not None:
            print(spec.devices_line)
        return 0
    try:
        wait_for(StatusWatch(cluster), timeout=None, interval=2.0)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_report(args: argparse.Namespace, _: list[str] | None) -> int:
    from sim.verdict.runfolder import report_run, resolve_run_dir

    run_dir = resolve_run_dir(args.run)
    up, total = _nodes_up(run_dir)
    if up:
        print(f"run {run_dir.name} is still running ({up} of {total} nodes up); the verdict below is provisional")
    elif total:  # ended, its cluster not removed (`up --detach`): the logs `down` would save, for the diagnoses
        from sim.cli.logs import live_run
        from sim.core.history import FILE_NAME, History

        live = live_run(History(run_dir / FILE_NAME).records())
        if live is not None:
            _save_logs(cluster_mod.Cluster(live[0], _docker()))
    verdict, summary = report_run(run_dir, expected=args.expect, live=bool(up))
    print(summary)
    return 0 if verdict.valid else 1


def _nodes_up(run_dir) -> tuple[int, int]:
    """(node containers up, node containers) of a run that has not ended; (0, 0) once it has."""
    from sim.cli.logs import live_run, nodes_up
    from sim.core.history import FILE_NAME, History

    live = live_run(History(run_dir / FILE_NAME).records())
    if live is None:
        return 0, 0
    cluster, run_id = live
    try:
        return nodes_up(cluster_mod.Cluster(cluster, _docker()).containers(), run_id)
    except SimError:  # no Docker engine here: none of the run's containers can be running
        return 0, 0


def cmd_logs(args: argparse.Namespace, _: list[str] | None) -> int:
    docker = _docker()
    docker.ping()
    name, node = _logs_target(args.words, args.name_flag, lambda n: cluster_mod.Cluster(n, docker).containers())
    cluster = choose_engine(docker, name=name).cluster(name)
    docker = cluster.docker
    if node:
        cluster.container(node)  # a clear error for an unknown node
    compose_file = cluster.compose_file if cluster.compose_file.exists() else None
    options = (["-f"] if args.follow else []) + ([node] if node else [])
    spec = cluster.spec
    if spec is None or not spec.secret_values():
        return docker.compose_process(cluster.project, compose_file, "logs", *options).wait()
    proc = docker.compose_process(cluster.project, compose_file, "logs", *options, capture=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # the --env values shown as *** (--env-show keeps them)
        print(spec.redact(line), end="", flush=True)
    return proc.wait()


def _logs_target(
    words: list[str], name_flag: str | None, containers: Callable[[str], list[cluster_mod.ContainerInfo]]
) -> tuple[str, str | None]:
    """(cluster, node or None) from `sim logs [NAME] [NODE]`: `sim logs node1` (the default cluster's
    node) and `sim logs h2` (a cluster, as `sim status h2` takes it) both read as a person means them."""
    if len(words) > 2 or (name_flag is not None and len(words) > 1):
        raise UsageError(f"sim logs: too many words ({' '.join(words)}); give `sim logs [NAME] [NODE]`")
    if name_flag is not None or len(words) == 2:
        name, node = (name_flag, words[0] if words else None) if name_flag is not None else (words[0], words[1])
        if not containers(name):
            raise UsageError(f"cluster '{name}': not found; `python -m sim ls` lists clusters")
        return name, node
    if not words:
        if not containers(DEFAULT_NAME):
            raise UsageError(f"cluster '{DEFAULT_NAME}': not found; `python -m sim ls` lists clusters")
        return DEFAULT_NAME, None
    word = words[0]
    if any(c.node == word for c in containers(DEFAULT_NAME)):
        return DEFAULT_NAME, word
    if containers(word):
        return word, None
    raise UsageError(
        f"sim logs {word}: neither a node of cluster '{DEFAULT_NAME}' nor a cluster; "
        "`python -m sim ls` lists clusters, `sim status NAME` their nodes"
    )


def cmd_doctor(args: argparse.Namespace, _: list[str] | None) -> int:
    from sim.cli.doctor import format_report, image_checks, rendered_audit, run_checks, running_audit

    docker = _docker()
    checks = run_checks(docker) + rendered_audit() + (running_audit(docker, args.name) if args.name else [])
    if args.image:
        checks += image_checks(docker, args.image)
    print(format_report(checks))
    return 0 if all(c.ok or not c.required for c in checks) else 1


def cmd_build(args: argparse.Namespace, _: list[str] | None) -> int:
    from sim.engines.images import ImageBuilder

    docker = _docker()
    docker.ping()
    result = ImageBuilder(docker).ensure()
    for field, tag in vars(result.images).items():
        print(f"{field:<8} {tag}{'  (built)' if field in result.built else ''}")
    return 0


def cmd_swarm(args: argparse.Namespace, _: list[str] | None) -> int:
    from sim.engines import swarm, swarm_hosts

    if args.swarm_command == "add-host":
        tls = (args.tls_ca, args.tls_cert, args.tls_key)
        engine = swarm_hosts.HostEngine(args.host, args.docker_host, args.context, *tls, insecure=args.insecure)
        version = "" if args.no_check else f" (engine {swarm_hosts.HostDocker(engine).ping()})"
        done = "replaced" if swarm_hosts.register(engine) else "registered"
        print(f"{done} swarm host '{engine.host}': {engine.address}{version}")
    elif args.swarm_command == "remove-host":
        engine = swarm_hosts.unregister(args.host)
        print(f"removed swarm host '{engine.host}' ({engine.address})")
    else:
        docker = _docker()
        docker.ping()
        print("\n".join(swarm.hosts_table(docker)))
    return 0


def _add_export(sub: argparse._SubParsersAction, up: argparse.ArgumentParser) -> None:
    """`sim export k8s SCENARIO | --script ... --nodes ...`: the job (and a scenario's faults) as Kubernetes YAML."""
    export = sub.add_parser(
        "export", help="write a scenario or a job as Kubernetes objects (PyTorchJob or TrainJob, Chaos Mesh Workflow)"
    )
    export_sub = export.add_subparsers(dest="export_command", metavar="FORMAT", parser_class=_Parser)
    export_sub.required = True
    k8s = export_sub.add_parser(
        "k8s",
        help="a Kubeflow PyTorchJob (or Trainer v2 TrainJob), its etcd, and the scenario's faults as one Chaos "
        "Mesh Workflow (+ NOTES.md)",
        description="Write a folder of Kubernetes YAML for a scenario (its cluster and faults), or for the job "
        "`sim up` would start with the same options. Nothing is applied: see docs/KUBERNETES.md.",
    )
    k8s.add_argument("scenario", nargs="?", help="a scenario file or shipped name (default: the job options only)")
    k8s.add_argument("--backend", help="the scenario's backend to export (default: its first)")
    k8s.add_argument(
        "--target",
        choices=("pytorchjob", "trainjob"),
        default="pytorchjob",
        help="pytorchjob: the Training Operator's elastic PyTorchJob (default); trainjob: a Kubeflow Trainer v2 "
        "TrainJob and its TrainingRuntime (no elastic policy: a fixed node count)",
    )
    k8s.add_argument("-o", "--output", metavar="DIR", help="the folder to write (default: ./k8s-NAME)")
    k8s.add_argument("--etcd-image", help="the etcd image (default: quay.io/coreos/etcd of the etcd version)")
    k8s.add_argument("--kubectl-image", help="the image of the Workflow's kubectl exec tasks")
    k8s.add_argument("--namespace", default="default", help="the namespace of every object (default: default)")
    # The job options, exactly as `sim up` takes them; --image is the worker image, in a registry the cluster
    # pulls from (default: elastic-sim's node image, pushed there).
    job_options = {
        *("engine", "placement", "ckpt_nfs", "ckpt_dir"),
        *("detach", "verbose", "keep", "timeout", "replace", "help"),
    }
    for action in up._actions:
        if action.dest not in job_options:
            k8s._add_action(action)


def cmd_export(args: argparse.Namespace, script_args: list[str] | None) -> int:
    from sim.export.k8s import DEFAULT_IMAGE, DEFAULT_KUBECTL_IMAGE, export_scenario, export_spec, write_export

    images = {
        "image": args.image or DEFAULT_IMAGE,
        "etcd_image": args.etcd_image,
        "kubectl_image": args.kubectl_image or DEFAULT_KUBECTL_IMAGE,
        "namespace": args.namespace,
        "target": args.target,
    }
    if args.scenario:
        from sim.scenarios.scenario import load_scenario
        from sim.scenarios.shipped import find_scenario

        scenario = load_scenario(find_scenario(args.scenario))
        if args.backend and args.backend not in scenario.backends:
            raise UsageError(
                f"--backend {args.backend}: scenario {scenario.name} runs on {', '.join(scenario.backends)}; "
                "use one of them"
            )
        export, title = export_scenario(scenario, args.backend, **images), scenario.name
    else:
        if args.backend:
            raise UsageError("--backend picks a scenario's backend; without a scenario use --rdzv-backend")
        spec = spec_from_options(vars(args), script_args)
        export, title = export_spec(spec, **images), spec.name
    out = Path(args.output or f"k8s-{title}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output {out}: a file, not a folder; give a folder to write the YAML into")
    written = write_export(export, out, title)
    if export.lost:
        print(export.lost, file=sys.stderr)  # what the target cannot keep: one line, NOTES.md says it in full
    print(f"wrote {len(written)} files to {out}/ ({len(export.objects())} objects; {len(export.notes)} notes)")
    for path in written:
        print(f"  {path}")
    chaos = f"; once training runs: kubectl apply -f {out}/chaos/" if "chaos/workflow.yaml" in export.files else ""
    print(f"next: kubectl apply -f {out}/{chaos} (see {out}/NOTES.md)")
    return 0


# ---------------------------------------------------------------- sim forecast


def _add_forecast(sub: argparse._SubParsersAction) -> None:
    forecast = sub.add_parser(
        "forecast",
        help="what failures will cost this job at scale, from a vet's measurements (goodput, τ*, levers)",
        description="Forecast the vetted job at the given scales: interruptions per day; the time lost to "
        "restarts, re-done work and checkpoints; goodput; Young's checkpoint interval and the biggest lever. "
        "From the vet's measurements (recovery per fault kind with its phases, the save cost, the checkpoint "
        "interval, the step time) and published failure rates (Llama 3's, by default), every assumption "
        "printed. --check runs a real soak of the job here and sets its goodput beside the forecast's.",
    )
    forecast.add_argument("vet", nargs="?", default=".", help="the vet's vet.json or its folder (default .)")
    forecast.add_argument(
        "--nodes", dest="scales", default="64,512,2048", metavar="N,N", help="scales (default 64,512,2048)"
    )
    forecast.add_argument("--gpus-per-node", type=int, default=8, metavar="G", help="GPUs per node (default 8)")
    forecast.add_argument(
        "--mtbf-node",
        metavar="TIME",
        help="a node's mean time between failures (e.g. 200d), in Llama 3's mix of kinds; per kind: "
        "[tool.elastic-sim.mtbf] in pyproject.toml (default: Llama 3's rates)",
    )
    forecast.add_argument(
        "--ckpt-every", type=int, metavar="STEPS", help="the checkpoint interval the job keeps (default: the vet's)"
    )
    forecast.add_argument("--save-cost", metavar="TIME", help="how long a save blocks training (default: the vet's)")
    forecast.add_argument(
        "--rdzv-conf",
        metavar="K=V,K=V",
        help="forecast at these rdzv settings (last_call_timeout, keep_alive_interval, keep_alive_max_attempt, "
        "join_timeout; or torch-defaults): the phases they set are moved from the vet's (default: the vet's own)",
    )
    forecast.add_argument("--out", metavar="DIR", help="where forecast.json goes (default: the vet's folder)")
    forecast.add_argument("--check", action="store_true", help="run a real soak of the job and compare (minutes)")
    forecast.add_argument(
        "--every",
        default="60s",
        metavar="TIME",
        help="--check: a fault this long after each recovery, on average (default 60s)",
    )
    forecast.add_argument("--soak", default="10m", metavar="TIME", help="--check: the soak's length (default 10m)")
    forecast.add_argument("--check-kind", default="kill-worker", metavar="KIND", help="--check: the fault kind")
    forecast.add_argument("--seed", type=int, default=1, help="--check: the soak's seed (default 1)")
    forecast.add_argument("--name", default="soak", help="--check: the soak's cluster name (default soak)")
    forecast.add_argument(
        "--remeasure",
        type=int,
        metavar="N",
        help="--check: first strike N faults of the kind to re-measure its cost on the soak's own cluster, under "
        "the soak's load, and judge the forecast from those (the vet's beside it); 0: judge the vet's own inputs "
        "(default 3)",
    )


def forecast_rates(mtbf_node: str | None, tool: Mapping[str, object]):
    """The failure rates: --mtbf-node over pyproject.toml's [tool.elastic-sim.mtbf] over Llama 3's."""
    from sim.vet.forecast import llama3_rates, parse_mtbf, scaled_rates, table_rates

    if mtbf_node is not None:
        return scaled_rates(llama3_rates(), parse_mtbf("--mtbf-node", mtbf_node), mtbf_node)
    if "mtbf" in tool:
        return table_rates(tool["mtbf"], "pyproject.toml [tool.elastic-sim.mtbf]")  # type: ignore[arg-type]
    return llama3_rates()


def vet_forecast(vet, rates):
    """`sim vet --forecast`: the forecast at the default scales from the vet just run (None, said, where its
    runs cannot give one: no fault recovered, no step seen)."""
    from sim.vet.forecast import forecast, measure_vet

    try:
        measured = measure_vet(vet.as_dict(), Path.cwd(), "this vet")
    except UsageError as error:
        print(f"sim vet: no forecast: {error}")
        return None
    return forecast(measured, rates)


def cmd_forecast(args: argparse.Namespace, _: list[str] | None) -> int:
    import json

    from sim.core.parse import parse_duration
    from sim.vet.forecast import forecast, measure, parse_scales, parse_settings, render, with_given

    scales = parse_scales(args.scales)
    settings = parse_settings(args.rdzv_conf) if args.rdzv_conf is not None else None
    if args.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node {args.gpus_per_node}: give 1 or more GPUs per node")
    rates = forecast_rates(args.mtbf_node, read_tool_config(Path.cwd()))
    every, soak = parse_duration(args.every), parse_duration(args.soak)
    vet_path = Path(args.vet)
    if args.ckpt_every is not None and args.ckpt_every < 1:
        raise UsageError(f"--ckpt-every {args.ckpt_every}: give the steps between two saves, 1 or more")
    save_cost = parse_duration(args.save_cost) if args.save_cost is not None else None
    measured = with_given(measure(vet_path), save_cost, args.ckpt_every)
    if args.check:  # its inputs checked before anything is printed or started
        from sim.vet.forecast_check import REMEASURE, check_inputs, run_check, vet_job

        remeasure = REMEASURE if args.remeasure is None else args.remeasure
        check_inputs(measured, args.check_kind, every, soak, remeasure)
        vet = json.loads(Path(measured.source).read_text(encoding="utf-8"))
        spec = vet_job(vet, Path(measured.source).parent)
    made = forecast(measured, rates, scales, args.gpus_per_node, settings)
    print(render(made))
    out = Path(args.out) if args.out else Path(measured.source).parent
    out.mkdir(parents=True, exist_ok=True)
    data = made.as_dict()
    if args.check:
        checked = run_check(
            measured,
            spec,
            kind=args.check_kind,
            every_s=every,
            duration_s=soak,
            seed=args.seed,
            name=args.name,
            remeasure=remeasure,
            docker=_docker(),
        )
        data["check"] = checked.as_dict()
        print(checked.line())
    (out / "forecast.json").write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"  json: {out / 'forecast.json'}")
    return 0 if not args.check or data["check"]["within"] else 1


# ---------------------------------------------------------------- sim tune


def _add_tune(sub: argparse._SubParsersAction) -> None:
    tune = sub.add_parser(
        "tune",
        help="try torch's elastic settings on your job and recommend the fastest safe set (torchrun and k8s flags)",
        description="Run the job through the faults whose recovery torch's settings decide (worker crash, node "
        "crash, a freeze past the keep-alive, a joining node) under each point of a small grid: keep-alive "
        "interval x attempts, last call and join timeouts (--rdzv-conf), --monitor-interval, and the process-group "
        "timeout where the script reads it from an option or the environment (found in the script). Points that "
        "break the safe nesting are not run; the grid is cut to --budget. Recommends the fastest point that "
        "survived every fault with no false restart, as torchrun and Kubernetes flags; writes tune.json and "
        "tune.html. Takes `sim vet`'s job options. Script arguments go after `--`.",
    )
    tune.add_argument("tune_script", nargs="?", metavar="SCRIPT", help="your torchrun training script")
    add_job_options(tune)
    tune.set_defaults(nodes=None)
    tune.add_argument("--budget", default="10m", metavar="TIME", help="the most the tune may take (default 10m)")
    tune.add_argument("--keep-alive", metavar="IxA,IxA", help="keep_alive_interval x keep_alive_max_attempt pairs")
    tune.add_argument("--last-call", metavar="S,S", help="last_call_timeout values, whole seconds")
    tune.add_argument("--join", metavar="S,S", help="join_timeout values (default: the least the nesting allows)")
    tune.add_argument("--monitor", metavar="S,S", help="--monitor-interval values in seconds (default 0.1)")
    tune.add_argument("--pg-timeout", metavar="S,S", help="process-group timeouts, where the script takes one")
    tune.add_argument("--faults", metavar="A,B", help="some of kill-worker,kill-node,pause,scale-up (default all)")
    tune.add_argument("--parallel", type=int, metavar="N", help="clusters at once (default 2)")
    tune.add_argument("--out", metavar="DIR", default=".", help="where tune.json and tune.html go (default .)")
    tune.add_argument("--name", default="tune", help="cluster name prefix (default tune)")
    tune.add_argument("--keep", action="store_true", help="keep the clusters for debugging instead of removing them")


def cmd_tune(args: argparse.Namespace, script_args: list[str] | None) -> int:
    from sim.core.parse import parse_duration
    from sim.vet.tune import plan_text, prepare, render, run_tune, write_outputs

    if args.monitor_interval is not None or args.rdzv_conf and _tuned_keys(args.rdzv_conf):
        raise UsageError(
            "sim tune chooses --monitor-interval and the keep-alive, last-call and join keys of --rdzv-conf; "
            "give the values to try with --monitor, --keep-alive, --last-call and --join instead"
        )
    if args.placement != "spread" or args.ckpt_nfs or args.ckpt_dir:
        raise UsageError("sim tune runs its clusters on this engine; drop --placement, --ckpt-nfs and --ckpt-dir")
    budget = parse_duration(args.budget)
    options = dict(vars(args), vet_script=args.tune_script, faults=None)
    tool = read_tool_config(Path.cwd())
    if args.tune_script or args.script or tool.get("script"):  # else the shipped trainer
        options, script_args, _ = vet_options(options, script_args, tool)
    docker = _docker()
    spec, kinds, grid, pg = prepare(options, script_args, vars(args), budget, parallel=args.parallel, docker=docker)
    print(plan_text(grid, kinds, pg), flush=True)
    tune = run_tune(spec, kinds, grid, pg, docker=docker, keep=args.keep)
    files = write_outputs(tune, Path(args.out))
    print(render(tune))
    print("  " + "   ".join(f"{kind}: {path}" for kind, path in files.items()))
    return 0 if tune.best is not None else 1


def _tuned_keys(conf: str) -> bool:
    from sim.vet.tune import Settings

    tuned = set(Settings(1, 1, 1, 1, 1.0).rdzv_conf())
    return any(pair.split("=", 1)[0].strip() in tuned for pair in conf.split(","))


COMMANDS = {
    "tune": cmd_tune,
    "forecast": cmd_forecast,
    "export": cmd_export,
    "swarm": cmd_swarm,
    "up": cmd_up,
    "vet": cmd_vet,
    "down": cmd_down,
    "ls": cmd_ls,
    "status": cmd_status,
    "report": cmd_report,
    "logs": cmd_logs,
    "doctor": cmd_doctor,
    "build": cmd_build,
}


if __name__ == "__main__":
    sys.exit(main())

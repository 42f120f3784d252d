"""Recovery figures, sim containers against bare torchrun processes: printed, never asserted.

The same trainer (trainer/train.py) and settings run as `sim` containers and as plain `torchrun`
processes on this host, in interleaved repetitions (bare then sim, then sim then bare, ...), and
each figure is the median seconds from the fault to the first training step after it:

  worker-kill   SIGKILL one worker of node2, to the first step of the restarted group (world 3)
  node-loss     node2's agent and workers killed at once (`docker kill` / SIGKILL to each process),
                to the first step at world 2
  preemption    SIGTERM to node2's agent, SIGKILL after a grace period (`docker stop -t`), to the
                first step at world 2
  scale-up      a third node starts beside a job of two (max 3), to the first step at world 3

Each on c10d and etcd-v2, with the fast profile (sim.scenarios.scenario.PROFILES) and torch's defaults.
Both sides get one spec: the bare command is the sim node's own (sim.core.torchrun) with the host's
endpoint. The fault always hits node2, never node0: node0 hosts the c10d store in the sim (its
hostname is the endpoint); on the bare side node0 starts first and binds the store port before the
others start (on one host every c10d agent would bind it). Bare etcd-v2 runs the sim etcd image's
own server binary (Debian's etcd 3.4, `--enable-v2=true`), fresh for each run as in the sim.

Times: bare, from just after the signal (or, for preemption and scale-up, just before the SIGTERM
or the new process); sim, from the history's fault record (sim.verdict.recovery.Recovery): its `ok` for
a kill (written once the signal is delivered), its `invoke` for a stop or a scale (those take time
themselves), to the Recovery's first_progress. The bare side reads the trainer's JSON lines.

Usage: .venv/bin/python bench/recovery.py [--reps 3] [--figures worker-kill,node-loss,...]
       [--backends c10d,etcd-v2] [--profiles fast,torch-defaults] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    ROOT,
    bare_env,
    bare_torchrun_argv,
    free_port,
    print_columns,
    quiet,
    save_results,
    trainer_records,
)
from sim.core.errors import SimError  # noqa: E402
from sim.core.history import FILE_NAME, History, WorkerRecord  # noqa: E402
from sim.core.spec import ClusterSpec, spec_from_options  # noqa: E402
from sim.engines.cluster import up  # noqa: E402
from sim.engines.docker import Docker  # noqa: E402
from sim.engines.images import ImageBuilder  # noqa: E402
from sim.faults.nemesis import Nemesis  # noqa: E402
from sim.scenarios.scenario import PROFILES, Scenario, scenario_spec_options  # noqa: E402
from sim.verdict.recovery import Recovery, recoveries  # noqa: E402
from sim.verdict.runmodel import RunModel  # noqa: E402

FIGURES = ("worker-kill", "node-loss", "preemption", "scale-up")
BACKENDS = ("c10d", "etcd-v2")
PROFILE_NAMES = tuple(PROFILES)
MAX_NODES = 3  # x 1 worker a side: what a 2-core machine holds without starving either side
VICTIM = 2  # node2: never node0, the c10d store host on both sides
GRACE_S = 10.0  # preemption: SIGKILL after this long (sim stop's default)
TRAINER = {"steps": 1_000_000, "step_time": 0.1, "ckpt_interval": 10}  # runs until torn down
WARM_S = 3.0  # training this long at the full world before the fault
START_TIMEOUT_S = 300.0
RECOVERY_TIMEOUT_S = 240.0
POLL_S = 1.0
T = TypeVar("T")
RESULTS = ROOT / "bench" / "results.json"
PHASES = ("detection_s", "rendezvous_s", "worker_start_s", "pg_init_s", "ckpt_load_s", "first_step_s")


class Unrecovered(Exception):
    """A run that did not reach the state waited for in time."""


@dataclasses.dataclass(frozen=True)
class Case:
    figure: str
    backend: str
    profile: str
    nodes: int = MAX_NODES  # the job's most nodes
    nproc: int = 1  # workers a node

    @property
    def world_before(self) -> int:
        """Workers training before the fault (start-up: when it is done)."""
        return (self.nodes - 1 if self.figure == "scale-up" else self.nodes) * self.nproc

    @property
    def world_after(self) -> int:
        lost = self.figure in ("node-loss", "preemption")
        return (self.nodes - 1 if lost else self.nodes) * self.nproc

    def spec(self, name: str) -> ClusterSpec:
        cluster = {
            "name": name,
            "nodes": self.world_before // self.nproc,
            "max_nodes": self.nodes,
            "nproc_per_node": self.nproc,
        }
        scenario = Scenario(
            name="bench-recovery",
            description="recovery benchmark",
            cluster=cluster,
            backends=(self.backend,),
            trainer=TRAINER,
            profile=self.profile,
        )
        options = scenario_spec_options(scenario, self.backend)
        return spec_from_options(options, options.pop("script_args", None))


@dataclasses.dataclass(frozen=True)
class Sample:
    seconds: float
    phases: object | None = None  # sim.verdict.recovery.RecoveryPhases where that exists; start-up: a dict
    startup_rdzv_s: float | None = None  # sim: the start-up rendezvous (startup_rendezvous)


def wait_until(what: str, check: Callable[[], T | None], timeout: float, poll: float = POLL_S) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        time.sleep(poll)
    raise Unrecovered(f"no {what} within {timeout:.0f} s")


def first_progress(records, world: int, after: float) -> float | None:
    """The first step at `world` at or after `after`."""
    return min(
        (r["t"] for r in records if r["sim"] == "progress" and r.get("world_size") == world and r["t"] >= after),
        default=None,
    )


# ---------------------------------------------------------------- bare torchrun processes


@dataclasses.dataclass(frozen=True)
class EtcdParts:
    """What bare etcd-v2 needs, the node image's own: its etcd server binary, and a folder with the
    python-etcd client torch's etcd-v2 backend imports (installed from the image's wheelhouse)."""

    server: Path
    client: Path

    @classmethod
    def of(cls, builder: ImageBuilder, version: str) -> EtcdParts:
        client = builder.cache_dir / "bench-python-etcd"
        if not (client / "etcd").is_dir():
            argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links"]
            argv += [str(builder.wheelhouse()), "--target", str(client), "python-etcd"]
            subprocess.run(argv, check=True)
        return cls(builder.etcd_binary(version), client)


class EtcdServer:
    """The sim etcd image's own server binary on free loopback ports, v2 API on, in a fresh data dir."""

    def __init__(self, binary: Path, folder: Path):
        self.port, peer = free_port(), f"http://127.0.0.1:{free_port()}"
        client = f"http://127.0.0.1:{self.port}"
        log = open(folder / "etcd.log", "wb")
        self.process = subprocess.Popen(
            [
                str(binary),
                "--name=etcd",
                f"--data-dir={folder / 'etcd-data'}",
                "--enable-v2=true",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=etcd={peer}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        # Polled often: start-up is timed from before this server starts, on both sides.
        wait_until("healthy bare etcd", lambda: 0.0 if self._healthy() else None, 30, poll=0.1)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as answer:
                return b"true" in answer.read()
        except OSError:
            return False

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


class BareJob:
    """The spec's nodes as torchrun processes on this host, each its own session, output in node{i}.log."""

    def __init__(self, spec: ClusterSpec, etcd: EtcdParts | None):
        self.spec = spec
        self.folder = Path(tempfile.mkdtemp(prefix="elastic-sim-bench-recovery-"))
        self.agents: dict[int, subprocess.Popen] = {}
        self.etcd = EtcdServer(etcd.server, self.folder) if spec.uses_etcd else None
        self.port = self.etcd.port if self.etcd else free_port()
        self.env = bare_env(spec, dict(os.environ), self.folder / "ckpt")
        if spec.uses_etcd:
            self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(etcd.client), os.environ.get("PYTHONPATH")]))

    def start(self, *, at_once: bool = False) -> None:
        """Every node's agent; node0 first unless `at_once` (start-up is timed: the sim's containers
        start together too, and on one host the agents that lose the race for the port use the store
        as clients; the fault figures want node0 the host, as in the sim)."""
        for index in range(self.spec.nodes):
            self.start_node(index)
            if index == 0 and not self.etcd and not at_once:
                # node0 binds the store port first, as node0 hosts it in the sim.
                wait_until("c10d store on node0", lambda: 0.0 if self._listening() else None, START_TIMEOUT_S)

    def start_node(self, index: int) -> None:
        argv = bare_torchrun_argv(self.spec, index, f"127.0.0.1:{self.port}", "bench")
        with open(self.folder / f"node{index}.log", "w") as out:
            self.agents[index] = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.folder, start_new_session=True
            )

    def _listening(self) -> bool:
        if self.agents[0].poll() is not None:
            raise Unrecovered(f"bare node0 exited: {self._tail(0)}")
        # A listening socket (state 0A) on the port, IPv4 or IPv6: nothing connects to the store to ask.
        return any(
            int(line.split()[1].rsplit(":", 1)[1], 16) == self.port and line.split()[3] == "0A"
            for table in ("/proc/net/tcp", "/proc/net/tcp6")
            for line in Path(table).read_text().splitlines()[1:]
        )

    def _tail(self, index: int) -> str:
        """The last line of a node's output (an agent's end: the exception it died of)."""
        lines = (self.folder / f"node{index}.log").read_text(errors="replace").split("\n")
        return next((line.strip() for line in reversed(lines) if line.strip()), "no output")[:300]

    def records(self, *, alive: tuple[int, ...] = ()) -> list[dict]:
        """Every node's trainer records, once the agents in `alive` are checked to be still running."""
        for index in alive:
            if self.agents[index].poll() is not None:
                raise Unrecovered(f"bare node{index} exited: {self._tail(index)}")
        found = []
        for index in self.agents:
            with open(self.folder / f"node{index}.log", errors="replace") as f:
                found += trainer_records(f)
        return found

    def workers(self, index: int) -> list[int]:
        agent = self.agents[index].pid
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == agent:
                    pids.append(int(entry.name))
        return pids

    def fault(self, figure: str) -> float:
        """Inject `figure` on node2; the fault's time."""
        if figure == "worker-kill":
            (worker,) = self.workers(VICTIM)
            os.kill(worker, signal.SIGKILL)
            return time.time()
        if figure == "node-loss":
            self.kill_node(VICTIM)
            return time.time()
        if figure == "preemption":
            t = time.time()
            self.agents[VICTIM].send_signal(signal.SIGTERM)
            try:
                self.agents[VICTIM].wait(GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            self.kill_node(VICTIM)
            return t
        t = time.time()
        self.start_node(MAX_NODES - 1)
        return t

    def kill_node(self, index: int) -> None:
        # Workers run in sessions of their own: each one is signalled, as `docker kill` does.
        for pid in [self.agents[index].pid, *self.workers(index)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.agents[index].wait()

    def stop(self) -> None:
        for index in self.agents:
            self.kill_node(index)
        if self.etcd:
            self.etcd.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def run_bare(case: Case, etcd: EtcdParts | None) -> Sample:
    t_start = time.time()
    job = BareJob(case.spec("bare"), etcd)
    try:
        job.start(at_once=case.figure == "start-up")
        if case.figure == "start-up":
            return Sample(first_step(lambda: job.records(alive=tuple(job.agents)), case.world_before) - t_start)
        warm(lambda: job.records(alive=tuple(job.agents)), case.world_before)
        t_fault = job.fault(case.figure)

        def recovered() -> float | None:
            records = job.records(alive=tuple(i for i in job.agents if i != VICTIM))
            started = min(
                (
                    r["t"]
                    for r in records
                    if r["sim"] == "start" and r.get("world_size") == case.world_after and r["t"] > t_fault
                ),
                default=None,
            )
            return None if started is None else first_progress(records, case.world_after, started)

        return Sample(wait_until(f"step at world {case.world_after}", recovered, RECOVERY_TIMEOUT_S) - t_fault)
    finally:
        job.stop()


def first_step(records: Callable[[], list[dict]], world: int, poll: float = 0.2) -> float:
    """The time of the job's first step at `world` (polled every 0.2 s where start-up is timed to it)."""
    return wait_until(f"step at world {world}", lambda: first_progress(records(), world, 0.0), START_TIMEOUT_S, poll)


def warm(records: Callable[[], list[dict]], world: int) -> None:
    """Wait until the job has trained WARM_S seconds at `world`."""
    first = first_step(records, world, POLL_S)
    wait_until("warm training", lambda: first_progress(records(), world, first + WARM_S), START_TIMEOUT_S)


# ---------------------------------------------------------------- sim containers


def startup_rendezvous(run: RunModel) -> float | None:
    """The start-up rendezvous once every node is there: from the last agent's entering it (the
    latest first rdzv_joining) to the last agent's completing it (the latest first rdzv_complete).
    Containers start seconds apart on a busy machine; this leaves that out."""
    joined: dict[str, float] = {}
    completed: dict[str, float] = {}
    for record in run.agent:  # in time order
        if record.event == "rdzv_joining":
            joined.setdefault(record.node, record.t)
        elif record.event == "rdzv_complete" and record.node in joined:
            completed.setdefault(record.node, record.t)
    if not joined or set(completed) != set(joined):
        return None
    last = max(joined, key=joined.get)
    return round(max(completed.values()) - joined[last], 3)


def startup_phases(run: RunModel, t_start: float, t_first_step: float) -> dict[str, float | None]:
    """Where a start-up goes, each phase ending when the last node (or worker) got there: the
    host's part of `up` (image check, render, until the history starts), Compose making and starting
    the containers, the agents' start (torchrun's own import, to entering the rendezvous), the
    rendezvous, the workers' start (spawn and `import torch`), process-group init, the first step.
    A phase with no record (no instrumentation) is None and the next one takes its time."""
    workers = [r for r in run.records if isinstance(r, WorkerRecord)]
    ends = {
        "host_s": run.start.t if run.start else None,
        "containers_s": _last(r.t for r in run.docker if r.action == "start" and r.node != "etcd"),
        "agents_s": _last(_firsts((r.node, r.t) for r in run.agent if r.event == "rdzv_joining")),
        "rendezvous_s": _last(_firsts((r.node, r.t) for r in run.agent if r.event == "rdzv_complete")),
        "worker_start_s": _last(r.t for r in workers if r.event == "imported"),
        "pg_init_s": _last(r.t for r in workers if r.event == "pg_ready"),
        "first_step_s": t_first_step,
    }
    phases, previous = {}, t_start
    for name, end in ends.items():
        phases[name] = None if end is None else round(end - previous, 3)
        previous = previous if end is None else end
    return phases


def _firsts(pairs) -> list[float]:
    """The first time of each key."""
    found: dict = {}
    for key, t in pairs:
        found.setdefault(key, t)
    return list(found.values())


def _last(times) -> float | None:
    return max(times, default=None)


def run_sim(case: Case, docker: Docker, prefix: str = "bench-recovery") -> Sample:
    spec = case.spec(f"{prefix}-{case.backend}")
    t_start = time.time()
    cluster = up(spec, docker, progress=quiet)
    try:
        history = History(cluster.run_dir / FILE_NAME)

        def model() -> RunModel:
            return RunModel(history.read().records)

        def records() -> list[dict]:
            return [{"sim": "progress", "t": b.t, "world_size": b.world_size} for b in model().progress]

        if case.figure == "start-up":
            first = first_step(records, case.world_before)
            return Sample(first - t_start, startup_phases(model(), t_start, first))
        warm(records, case.world_before)
        startup = startup_rendezvous(model())
        op = sim_fault(Nemesis(cluster), case.figure)

        def recovered() -> Recovery | None:
            # Until the restart shows in the history, a live Recovery's first step is the others' next one.
            found = next((r for r in recoveries(model()) if r.fault.op == op), None)
            done = found and found.restart and found.first_progress and found.world_after == case.world_after
            return found if done else None

        recovery = wait_until(f"recovery at world {case.world_after}", recovered, RECOVERY_TIMEOUT_S)
        t_fault = recovery.fault.t_invoke if case.figure in ("preemption", "scale-up") else recovery.fault.t_ok
        return Sample(recovery.first_progress.t - t_fault, getattr(recovery, "phases", None), startup)
    finally:
        cluster.down(save_logs=False)


def sim_fault(nemesis: Nemesis, figure: str) -> str:
    victim = f"node{VICTIM}"
    if figure == "worker-kill":
        return nemesis.kill_worker(victim)["op"]
    if figure == "node-loss":
        return nemesis.kill_node(victim)["op"]
    if figure == "preemption":
        return nemesis.stop_node(victim, grace=GRACE_S)["op"]
    return nemesis.scale(MAX_NODES)["op"]


# ---------------------------------------------------------------- the run


def measure(case: Case, reps: int, docker: Docker, etcd: EtcdParts | None) -> dict:
    sides: dict[str, list[Sample]] = {"bare": [], "sim": []}
    notes = []
    label = f"{case.figure} {case.backend} {case.profile}"
    for rep in range(reps):
        order = ("bare", "sim") if rep % 2 == 0 else ("sim", "bare")
        for side in order:
            try:
                sample = run_bare(case, etcd) if side == "bare" else run_sim(case, docker)
            except (Unrecovered, SimError, ValueError) as error:
                notes.append(f"{side} rep {rep + 1}: {error}")
                print(f"  {label} {side} rep {rep + 1}: FAILED ({error})", flush=True)
                continue
            sides[side].append(sample)
            print(f"  {label} {side} rep {rep + 1}: {sample.seconds:.2f} s", flush=True)
        if rep + 1 < reps and not sides["bare"] and not sides["sim"]:
            # Both sides fail (scale-up at torch defaults: torch's shared store): no ratio to measure, and
            # each further failure costs the full wait.
            notes.append(f"both sides failed in repetition {rep + 1}: not repeated")
            print(f"  {label}: both sides failed, not repeated", flush=True)
            break
    bare = median([s.seconds for s in sides["bare"]])
    sim = median([s.seconds for s in sides["sim"]])
    return {
        "figure": case.figure,
        "backend": case.backend,
        "profile": case.profile,
        "bare_s": bare,
        "sim_s": sim,
        "ratio": round(sim / bare, 2) if bare and sim else None,
        "reps": {side: len(samples) for side, samples in sides.items()},
        "samples": {side: [round(s.seconds, 2) for s in samples] for side, samples in sides.items()},
        "sim_phases": median_phases([s.phases for s in sides["sim"]]),
        "notes": notes,
    }


def measures(row: dict) -> tuple:
    """What a row measures: a rerun of some figures replaces only their rows in the results file."""
    return row["figure"], row["backend"], row["profile"]


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def median_phases(phases: list[object | None]) -> dict | None:
    known = [p for p in phases if p is not None]
    if not known:
        return None
    names = list(known[0]) if isinstance(known[0], dict) else PHASES
    found = {}
    for name in names:
        values = [p.get(name) if isinstance(p, dict) else getattr(p, name, None) for p in known]
        found[name] = median([v for v in values if v is not None])
    return found


def print_table(rows: list[dict]) -> None:
    head = ("figure", "backend", "profile", "bare s", "sim s", "sim/bare", "reps b/s")
    lines = [head] + [
        (
            r["figure"],
            r["backend"],
            r["profile"],
            _num(r["bare_s"]),
            _num(r["sim_s"]),
            _num(r["ratio"]),
            f"{r['reps']['bare']}/{r['reps']['sim']}",
        )
        for r in rows
    ]
    print_columns(lines)
    phased = [r for r in rows if r["sim_phases"]]
    if phased:
        print("\nsim side, median phases (s)")
        for r in phased:
            values = ", ".join(f"{name.removesuffix('_s')} {_num(v)}" for name, v in r["sim_phases"].items())
            print(f"  {r['figure']} {r['backend']} {r['profile']}: {values}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def choices(text: str, known: tuple[str, ...], flag: str) -> tuple[str, ...]:
    picked = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [item for item in picked if item not in known]
    if unknown or not picked:
        raise SystemExit(f"{flag} {text!r}: use a comma-separated list of {', '.join(known)}")
    return picked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per side (default 3)")
    parser.add_argument("--figures", default=",".join(FIGURES))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--profiles", default=",".join(PROFILE_NAMES))
    parser.add_argument("--quick", action="store_true", help="1 repetition, fast profile only (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    args = parser.parse_args()
    figures = choices(args.figures, FIGURES, "--figures")
    backends = choices(args.backends, BACKENDS, "--backends")
    profiles = ("fast",) if args.quick else choices(args.profiles, PROFILE_NAMES, "--profiles")
    reps = 1 if args.quick else max(1, args.reps)
    docker = Docker()
    docker.ping()
    builder = ImageBuilder(docker, progress=print)
    builder.ensure(need_etcd="etcd-v2" in backends)
    etcd = None
    if "etcd-v2" in backends:
        etcd = EtcdParts.of(builder, Case("node-loss", "etcd-v2", "fast").spec("bench").etcd_server_version)
    print(
        f"recovery: {MAX_NODES} nodes x 1 worker a side (a 2-core machine), trainer {TRAINER}, fault on node{VICTIM}, "
        f"{reps} rep(s) a side, interleaved; {os.cpu_count()} CPUs",
        flush=True,
    )
    # SIGTERM (a `timeout`) ends the run through the same clean-up as Ctrl-C: clusters down, processes killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = []
    for profile in profiles:
        for backend in backends:
            for figure in figures:
                rows.append(measure(Case(figure, backend, profile), reps, docker, etcd))
                save_results(args.out, "recovery", rows, same=measures)  # what is done so far survives a stop
    print()
    print_table(rows)
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

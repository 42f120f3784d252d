"""pytest plugin (entry point `pytest11`): fault-tolerance tests for your own training script.

    def test_my_job_survives_a_node_loss(sim_cluster):
        cluster = sim_cluster(nodes=3, script="train.py", max_restarts=3)
        ...

    def test_my_job_survives_the_gauntlet(sim_vet):
        result = sim_vet("train.py", quick=True, script_args=["--epochs", "1000"])   # sim.vet.gauntlet.VetResult
        assert result.passed, result.scorecard

    A GPU script runs with CUDA and NCCL emulated on CPU unless told otherwise:
    sim_cluster(script="train.py", devices="emulated", failure_timing="gloo") (or devices="gpu", gpus="1").

    def test_my_package_job(sim_cluster):                 # the job's own environment (README)
        cluster = sim_cluster(project_dir=".", script="train.py", requirements="requirements.txt",
                              mounts=["./data:/data"], image=None)

    def test_my_job_at_scale(sim_vet, sim_forecast):      # what failures cost it at 512 nodes (pure: no Docker)
        made = sim_forecast(sim_vet("train.py", faults="kill-worker,kill-node"), nodes=[512])
        assert made.scales[0].shares.goodput > 0.9, made.scales[0].levers

    def test_my_settings(sim_tune):                       # torch's elastic settings, tried on the job
        tuned = sim_tune("train.py", budget="10m", script_args=["--epochs", "1000"])   # sim.vet.tune.TuneResult
        assert tuned.best is not None, tuned.points       # tuned.torchrun: the flags to use

    def test_worker_crash(sim_scenario):
        for result in sim_scenario("worker-crash"):      # a shipped name or a YAML path
            assert_verdict(result)

Clusters made through the fixtures are always torn down: on success, on
failure, and on Ctrl-C (pytest runs finalizers on KeyboardInterrupt).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from sim.core.errors import SimError
from sim.core.spec import ClusterSpec, spec_from_options
from sim.engines.cluster import Cluster
from sim.engines.docker import Docker
from sim.engines.engine import ClusterEngine, choose_engine


class VerdictMismatch(AssertionError):
    pass


def assert_verdict(result) -> None:
    """Fail with the run's summary and the path of its timeline picture."""
    if not result.passed:
        raise VerdictMismatch(
            f"scenario {result.scenario} [{result.backend}]: expected {result.expected}, the verdict disagrees\n"
            f"{result.summary}\ntimeline: {result.timeline}"
        )


@pytest.fixture(scope="session")
def sim_docker() -> Docker:
    """A reachable Docker engine with Compose v2. With CI=true a missing engine fails; elsewhere it skips."""
    docker = Docker()
    try:
        docker.ping()
        docker.compose_argv  # noqa: B018 (resolving it fails now if Compose v2 is missing)
    except SimError as error:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Docker is required in CI: {error}")
        pytest.skip(f"Docker not available: {error}")
    return docker


@pytest.fixture
def sim_cluster(sim_docker) -> Iterator[Callable[..., Cluster]]:
    """Factory: `sim_cluster(ClusterSpec(...))` or `sim_cluster(nodes=3, ...)` -> a running Cluster."""
    made: list[tuple[ClusterEngine, Cluster]] = []

    def make(spec: ClusterSpec | None = None, *, script_args=None, **options) -> Cluster:
        spec = spec or spec_from_options(options, script_args)
        engine = choose_engine(sim_docker, spec=spec)  # the spec's engine (--engine), as `sim up` does
        cluster = engine.up(spec)
        made.append((engine, cluster))
        return cluster

    try:
        yield make
    finally:
        for engine, cluster in made:
            engine.down(cluster)


@pytest.fixture
def sim_scenario(sim_docker) -> Callable[..., list]:
    """Run a scenario file (or shipped name) on each of its backends; returns ScenarioResults."""
    from sim.scenarios.runner import run_scenario
    from sim.scenarios.scenario import load_scenario
    from sim.scenarios.shipped import find_scenario

    def run(name_or_path: str, *, backend: str | None = None, seed: int | None = None) -> list:
        return run_scenario(load_scenario(find_scenario(name_or_path)), backend, docker=sim_docker, seed=seed)

    return run


@pytest.fixture
def sim_vet(sim_docker) -> Callable[..., object]:
    """`sim vet` from a test: `sim_vet(script, faults=None | "a,b" | [...], quick=False, script_args=None,
    out_dir=None, parallel=None, **up_options)` runs the gauntlet and returns its sim.vet.gauntlet.VetResult (the object
    vet.json holds); with out_dir it also writes vet.json and vet.html there."""
    from pathlib import Path

    from sim.vet.gauntlet import prepare, run_vet, write_outputs

    def run(script, *, faults=None, quick=False, script_args=None, out_dir=None, parallel=None, **options):
        if faults is not None and not isinstance(faults, str):
            faults = ",".join(faults)
        spec, kinds = prepare({**options, "script": str(script)}, script_args, faults, quick)
        result, _ = run_vet(spec, kinds, chosen=faults is not None, docker=sim_docker, parallel=parallel)
        if out_dir is not None:
            write_outputs(result, Path(out_dir))
        return result

    return run


@pytest.fixture
def sim_forecast() -> Callable[..., object]:
    """`sim forecast` from a test: `sim_forecast(vet, nodes=(64, 512, 2048), gpus_per_node=8, mtbf_node=None,
    rdzv_conf=None)`, `vet` a sim.vet.gauntlet.VetResult (sim_vet's) or the path of a vet.json (or its folder); returns
    the sim.vet.forecast.Forecast (its `scales`, each with `shares.goodput`, `young_s` and `levers`). Failure rates:
    Llama 3's, or Llama 3's mix at a node MTBF of `mtbf_node` ("200d"). `rdzv_conf`: the rdzv settings to forecast
    at (`sim forecast --rdzv-conf`'s text, e.g. "torch-defaults"); default the vet's own."""
    from pathlib import Path

    from sim.vet.forecast import (
        DEFAULT_SCALES,
        forecast,
        llama3_rates,
        measure,
        measure_vet,
        parse_mtbf,
        parse_settings,
        scaled_rates,
    )

    def run(vet, *, nodes=DEFAULT_SCALES, gpus_per_node=8, mtbf_node=None, rdzv_conf=None):
        if isinstance(vet, (str, os.PathLike)):
            measured = measure(Path(vet))
        else:
            measured = measure_vet(vet.as_dict(), Path.cwd(), "this vet")
        rates = llama3_rates()
        if mtbf_node is not None:
            rates = scaled_rates(rates, parse_mtbf("mtbf_node", mtbf_node), mtbf_node)
        settings = parse_settings(rdzv_conf) if rdzv_conf is not None else None
        return forecast(measured, rates, tuple(nodes), gpus_per_node, settings)

    return run


@pytest.fixture
def sim_tune(sim_docker) -> Callable[..., object]:
    """`sim tune` from a test: `sim_tune(script, budget="10m", faults=None, keep_alive=None, last_call=None,
    join=None, monitor=None, pg_timeout=None, script_args=None, out_dir=None, parallel=None, **up_options)`, the
    grid lists as the command's ("2x3,3x3", "1,3", ...), tries each point of the grid on real clusters and returns
    the sim.vet.tune.TuneResult (`best`: the recommended point or None, `torchrun`, `k8s`, `points`); with out_dir it
    also writes tune.json and tune.html there."""
    from pathlib import Path

    from sim.core.parse import parse_duration
    from sim.vet.tune import prepare, run_tune, write_outputs

    def run(script=None, *, budget="10m", faults=None, script_args=None, out_dir=None, parallel=None, **options):
        grid_keys = ("keep_alive", "last_call", "join", "monitor", "pg_timeout")
        grid = {key: options.pop(key, None) for key in grid_keys}
        grid["faults"] = faults if faults is None or isinstance(faults, str) else ",".join(faults)
        seconds = parse_duration(budget) if isinstance(budget, str) else float(budget)
        job = {**options, "script": None if script is None else str(script)}
        spec, kinds, made, pg = prepare(job, script_args, grid, seconds, parallel=parallel, docker=sim_docker)
        result = run_tune(spec, kinds, made, pg, docker=sim_docker)
        if out_dir is not None:
            write_outputs(result, Path(out_dir))
        return result

    return run

"""The user's script: its own error (the exception, its file:line, a fix per common crash) and the restart budget
it burned.

Registered, in order, by registry.py's DIAGNOSES."""

from __future__ import annotations

import dataclasses
import re

from sim.core.agentlog import parse_docker_timestamp, worker_error_kind
from sim.core.history import AgentRecord, WorkerRecord
from sim.core.nodes import node_order
from sim.verdict.checkers import exits_words, job_ended
from sim.verdict.diagnoses.evidence import (
    Diagnosis,
    _agent_nodes,
    _at,
    _clip,
    _describe,
    _line,
)
from sim.verdict.runmodel import RunModel


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
CPU_ALLOCATOR_FULL = "can't allocate memory"  # torch's DefaultCPUAllocator, refusing a tensor


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
        # A start ended by its worker's failure: the agent's worker_failed, or the worker's own non-zero exit where its
        # agent restarted the group for another reason first (it saw a node waiting: new_nodes) and never said so.
        failed = [r.t for r in run.agent_events("worker_failed", node=node)]
        failed += [
            r.t
            for r in run.records
            if isinstance(r, WorkerRecord) and r.node == node and r.event == "exit" and r.code not in (None, 0)
        ]
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
    if name.endswith("OutOfMemoryError") or "out of memory" in message.lower() or CPU_ALLOCATOR_FULL in message:
        # Under the device emulation a "GPU" allocation is the node's memory (the emulation says so in its message).
        in_node = "Emulated on CPU" in message or CPU_ALLOCATOR_FULL in message
        return (
            " (out of memory)",
            "Use less memory per worker: a smaller batch (with gradient accumulation to keep the effective batch), "
            "activation checkpointing (torch.utils.checkpoint), mixed precision (torch.autocast), fewer workers "
            "per node; for fragmentation, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (`--env`)."
            + (
                " Here the memory that ran out is the node's (devices emulated on CPU): give each node more with "
                "`--memory SIZE` (or `--memory none`), or run fewer nodes; a size your GPUs hold may not fit a "
                "CPU-only machine at all."
                if in_node
                else ""
            ),
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


# ---------------------------------------------------------------- a job that ended without training

# What is not the script's own output in a node's log: torch's log lines (glog's "I1205 05:27:01.313000 7 ..." and
# logging's "I2026-12-05 05:27:01,980 7 ..."), torchrun's OMP banner, elastic-sim's own entrypoint lines.
_NOT_SCRIPT_OUTPUT = re.compile(
    r"^([IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ |[IWEF]\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ +\d+ |\*{10,}|"
    r"Setting OMP_NUM_THREADS environment variable|elastic-sim: )"
)
_RANK_PREFIX = re.compile(r"^\[(default)?rank\d+\]:\s?")
# A script's own last words: at most this many, each at most this long.
LAST_LINES = 3
LAST_LINE_CHARS = 160


def script_output(text: str) -> list[tuple[float | None, str]]:
    """The script's own lines in a node's log (`docker logs --timestamps` form, or plain), in order: what its
    workers printed, without torch's, torchrun's and elastic-sim's own lines."""
    lines = []
    for raw in text.splitlines():
        t, body = parse_docker_timestamp(raw)
        body = _RANK_PREFIX.sub("", body.rstrip())
        if body.strip() and not _NOT_SCRIPT_OUTPUT.match(body):
            lines.append((t, body))
    return lines


def ended_without_training(run: RunModel, logs: dict[str, str] | None = None) -> Diagnosis | None:
    """The job ended, and no worker ever trained (no optimizer step, no collective after the process group's
    set-up), with no error of the script's to say why (script-error names those): the script returned before its
    training loop, by its own choice (a device check, data not found). Quotes its last lines and its exit codes."""
    instrumented = run.spec_fields.instrument is not False
    if run.start is None:
        return None  # logs alone (no run of ours): what could have seen training is unknown
    if run.trained or not (instrumented or run.step_lines_expected) or not job_ended(run):
        return None
    if script_failure(run) is not None or not (run.starts or run.agent_events("group_started")):
        return None
    exits = run.worker_exits()
    finished = run.agent_events("group_finished")
    how = exits_words(exits) or ("every agent's workers finished (exit 0)" if finished else "its workers exited")
    last: list[tuple[str, float | None, str]] = []  # (node, t, line): each node's last lines
    for node in sorted(set(logs or {}) & set(run.agent_nodes), key=node_order):  # not etcd's log
        last += [(node, t, line) for t, line in script_output(logs[node])[-LAST_LINES:]]
    latest = max(last, key=lambda item: item[1] or 0.0) if last else None
    quoted = _clip(latest[2], LAST_LINE_CHARS) if latest else None
    cause = (
        f"The job ended without training: {how}"
        + (f" after '{quoted}'" if quoted else "")
        + (
            ". No worker took an optimizer step or called a collective after setting up its process group, so nothing "
            "of the job's recovery could be judged: a run that never trained is never a PASS."
        )
    )
    evidence = [f"{node} {_at(t) if t is not None else '?'}  {_clip(line, LAST_LINE_CHARS)}" for node, t, line in last]
    evidence += [
        _line(r, f"worker rank {r.rank} exited {r.code}")
        for r in run.records
        if getattr(r, "TYPE", None) == "worker" and getattr(r, "event", None) == "exit"
    ][:4]
    evidence += [_line(r, "worker group finished") for r in finished[:2]]
    per_node = run.spec_fields.nproc_per_node
    said = " ".join(line for _, _, line in last).lower()
    if re.search(r"\b(gpus?|cuda|accelerator|devices?)\b", said):
        fix = (
            "The script stopped at its own device check. The nodes have no GPUs: run with CUDA emulated on CPU "
            f"(`--devices emulated`, the default without --gpus), which gives each node as many devices as "
            f"--nproc-per-node ({per_node if per_node is not None else '?'} here): a script that wants more devices "
            "needs a larger --nproc-per-node; or give the nodes real GPUs with `--gpus N`."
        )
    else:
        fix = (
            "Make the script reach its training loop in the nodes: its last lines say why it stopped. Data or a file "
            "it looks for: bring it into every node with `--mount HOST:CONTAINER` (e.g. `--mount ./data:/data`) or "
            "`--project-dir DIR`; an argument it needs: after `--` on the `sim up` command line."
        )
    return Diagnosis(
        "ended-without-training",
        f"The job ended without training: {how}" + (f" after '{_clip(quoted, 80)}'" if quoted else ""),
        cause,
        evidence,
        fix,
    )


def trained_through(run: RunModel) -> Diagnosis | None:
    """A run meant to end on its fault (a scenario expecting "fails", a vet's job-ending fault on a cluster of its
    own) in which no agent ended, and every node trained on after the fault to the run's stop: the job survived it.
    The FAIL is the expectation's, not the job's; "hung" would be untrue (seen: etcd restarted on a Swarm engine
    with no upstream DNS, where the agents' lookups of the gone task waited instead of failing)."""
    if run.scenario is None or run.scenario.expected != "fails" or not run.faults or not run.agent_nodes:
        return None
    if any((last := run.lifecycle(node)) is not None and last.action == "die" for node in run.agent_nodes):
        return None
    steps = {node: run.trained_on(node) for node in run.agent_nodes}
    if any(found is None for found in steps.values()):
        return None
    fault = run.faults[-1]
    evidence = [
        _line(final, f"still training at step {final.step} ({final.step - first.step} steps after the fault)")
        for first, final in steps.values()
    ]
    return Diagnosis(
        "trained-through",
        "the job trained on through a fault that was expected to end it",
        f"{fault.describe()} was expected to end the job, and no agent ended: every node trained on after it to "
        "the run's end. The job survived it; it did not hang.",
        [f"{fault.where or '?'} {_at(fault.t_ok)}  fault {fault.fault} done", *evidence],
        "Nothing to fix in the job. If surviving it is right here, expect it (`expect: recovers` for this backend in "
        "the scenario); if the job should have ended, check that the fault reached what the job depends on (for a "
        "store restart: whether the agents' calls failed or only waited until it was back).",
    )

"""Diagnoses on logs captured from real torchrun 2.13 runs (tests/data/logs/, see its README).

Each capture is the verbatim output of bare `torchrun` agents on one host (the node image's
rendezvous log hook on, LOGLEVEL=INFO), trimmed of lines no diagnosis reads. Some are plain text,
some carry `docker logs --timestamps` stamps: diagnose() reads both. History records that only a
sim run has (run spec, faults, Docker events) are written by hand beside them.
"""

import json
import re
from pathlib import Path

from sim.core.agentlog import parse_docker_timestamp
from sim.core.sidechannel import ProgressMatcher
from sim.verdict.diagnoses.registry import diagnose, format_diagnoses

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"
PROGRESS_REGEX = r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"


def logs(case: str, **names: str) -> dict[str, str]:
    """node name -> log text of one capture; by default every <node>.log in the folder."""
    folder = LOGS / case
    if names:
        return {node: (folder / file).read_text() for node, file in names.items()}
    return {path.stem: path.read_text() for path in sorted(folder.glob("*.log"))}


def side_channel(case: str, node: str) -> list[dict]:
    """The capture's worker records (written by images/node/elastic_sim_instrument.py), as the
    collector appends them: the node named as in the logs."""
    lines = (LOGS / case / f"{node}.events.jsonl").read_text().splitlines()
    return [{**json.loads(line), "node": node} for line in lines if line.strip()]


def log_progress(node: str, text: str) -> list[dict]:
    """What the collector makes of the script's own lines with --progress-regex."""
    matcher, records = ProgressMatcher(PROGRESS_REGEX), []
    for line in text.splitlines():
        t, body = parse_docker_timestamp(line)
        if (record := matcher.match(node, t, body)) is not None:
            records.append(record)
    return records


def run_start(t: float = 0.0, **spec) -> dict:
    return {"t": t, "type": "run", "event": "start", "spec": spec}


def codes(diagnoses) -> list[str]:
    return [d.code for d in diagnoses]


def evidence(diagnosis) -> str:
    return "\n".join(diagnosis.evidence)


# --------------------------------------------------------------------------- (a) shared TCP store


def test_shared_store_loop_etcd_v2_two_agents():
    """etcd-v2, torch defaults, --max-restarts 1: node1's worker SIGKILLed; the next round's gloo
    groups are refused on both nodes, node1 runs out of restarts, node0 gets RendezvousClosedError."""
    found = diagnose([], logs("shared_store_etcd_v2"))
    assert codes(found) == ["shared-tcp-store", "restart-budget"]
    store = found[0]
    assert "node0, node1" in store.cause and "RendezvousClosedError" in store.cause
    assert "node1 14:09:40.0  worker local_rank 0 (pid 15572) failed, exitcode -9" in store.evidence
    assert (
        "node0 14:09:46.8  Gloo connectFullMesh failed with timed out connecting: SO_ERROR: Connection refused"
        in evidence(store)
    )
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in store.fix and "--env" in store.fix


def test_shared_store_not_blamed_when_the_opt_out_is_set():
    history = [run_start(env=[["TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"]])]
    assert "shared-tcp-store" not in codes(diagnose(history, logs("shared_store_etcd_v2")))


def test_shared_store_one_node_c10d_refused_then_hung():
    """c10d, one agent with 2 workers, --max-restarts 3: after a worker SIGKILL the first new
    round is refused and the second hangs in init_process_group until the agent is stopped."""
    text = (LOGS / "shared_store_hang" / "node0.log").read_text()
    history = side_channel("shared_store_hang", "node0")
    found = diagnose(history, {"node0": text})
    assert codes(found)[0] == "shared-tcp-store"
    store = found[0]
    assert "connectFullMesh failed" in evidence(store)
    assert "never trained" in store.cause
    assert "worker group started again; no training and no error for" in evidence(store)


def test_shared_store_hang_only_on_both_nodes():
    """A CI run (etcd-v2, two nodes of two workers, torch defaults): node1's worker SIGKILLed; the next
    round's four workers imported torch and then hung in init_process_group, with no refusal, until the
    scenario's 2 min timeout. The silence runs to the end of the run, not to the workers' last import."""
    found = diagnose(*captured_run("shared_store_hang_after_restart"))
    assert codes(found)[0] == "shared-tcp-store"
    store = found[0]
    assert "never trained" in store.cause and "connectFullMesh" not in store.cause
    hung = [line for line in store.evidence if "worker group started again" in line]
    assert [line.split()[0] for line in hung] == ["node0", "node1"]
    assert all("no training and no error for 105 s after it" in line for line in hung)


def test_a_hang_with_a_peer_lost_at_its_start_is_not_the_shared_store():
    """The same capture with a third node killed just as the restarted group started: the group's hang has a cause
    of its own (a peer counted in the round and gone), so the shared store's premise, a hang with every peer up, is
    false."""
    history, node_logs = captured_run("shared_store_hang_after_restart")
    started = next(
        r["t"] for r in history if r.get("type") == "agent" and r.get("event") == "group_started" and r["t"] > 0
    )
    restarted = [r["t"] for r in history if r.get("type") == "agent" and r.get("event") == "group_started"][-1]
    assert restarted > started
    history = sorted([*history, {"t": restarted + 1, "type": "docker", "node": "node2", "action": "die"}],
                     key=lambda r: r["t"])  # fmt: skip
    assert "shared-tcp-store" not in codes(diagnose(history, node_logs))


def test_a_first_round_connect_failure_is_not_the_shared_store():
    """Refused connections with no earlier failure are a different problem (a peer that never came up)."""
    text = "\n".join(
        line
        for line in (LOGS / "shared_store_etcd_v2" / "node0.log").read_text().splitlines()
        if "exitcode" not in line and "attempts left" not in line and "new nodes" not in line and "Detected" not in line
    )
    assert "shared-tcp-store" not in codes(diagnose([], {"node0": text}))


# --------------------------------------------------------------------------- (b) restart budget


def test_restart_budget_used_up_per_agent():
    """etcd-v2, store opt-out, --max-restarts 1: node1's worker SIGKILLed twice; node1 gives up
    (root cause block), node0 had used its own restart for the regroup and gets RendezvousClosedError."""
    found = diagnose([], logs("restart_budget"))
    assert codes(found) == ["restart-budget"]
    budget = found[0]
    assert budget.title == "Restart budget used up on node1 (1 of 1)"
    assert "node0 used 1 of 1" in budget.cause
    assert budget.evidence[0] == (
        "node1 14:21:40.4  worker local_rank 0 (pid 28001) failed, exitcode -9: restart 1 of 1 used"
    )
    assert budget.evidence[1] == (
        "node1 14:21:54.2  worker local_rank 0 (pid 28095) failed, exitcode -9: no restart left"
    )
    assert "root cause: rank 1 (local_rank: 0), exitcode -9" in budget.evidence[2]
    assert "--max-restarts" in budget.fix


def test_restart_budget_zero_from_the_spec():
    """With --max-restarts 0 torch prints no "attempts left" line at all: the first failure ends it."""
    text = "\n".join(
        line for line in (LOGS / "restart_budget" / "node1.log").read_text().splitlines() if "attempts left" not in line
    )
    found = diagnose([run_start(max_restarts=0)], {"node1": text})
    assert found[0].title == "Restart budget used up on node1 (0 of 0)"


# --------------------------------------------------------------------------- (c) waiting for nodes


def test_rendezvous_timeout_waiting_for_nodes():
    """etcd-v2, --nnodes 2 with one agent, join_timeout=20: RendezvousTimeoutError after 20 s."""
    found = diagnose([run_start(min_nodes=2)], logs("rdzv_timeout"))
    assert codes(found) == ["waiting-for-nodes"]
    wait = found[0]
    assert wait.evidence == (
        "node0 14:22:59.1  agent entered the rendezvous, waited 20 s",
        "node0 14:23:19.5  RendezvousTimeoutError: not enough nodes joined in time",
    )
    assert "at least 2 nodes (--min-nodes)" in wait.cause and "join_timeout" in wait.fix


def test_waiting_now_with_a_node_gone_and_another_cut_off():
    """A history as the collector writes it: 3 nodes, min 3; node2 killed, the others regroup and
    sit in the rendezvous with no training since (hand-written: a live wait cannot be captured
    finished)."""
    t0 = 1_800_000_000.0
    history = [
        run_start(t0, nodes=3, min_nodes=3),
        {"t": t0 + 5, "type": "worker", "node": "node0", "event": "step", "n": 1, "step": None},
        {"t": t0 + 10, "type": "fault", "op": "f1", "fault": "kill-node", "target": "node2", "phase": "ok"},
        {"t": t0 + 10.1, "type": "docker", "node": "node2", "action": "die", "exit_code": 137},
        # etcd restarted meanwhile: a container, no training node (once counted among the live ones)
        {"t": t0 + 10.5, "type": "docker", "node": "etcd", "action": "kill"},
        {"t": t0 + 10.8, "type": "docker", "node": "etcd", "action": "start"},
        {
            "t": t0 + 11,
            "type": "agent",
            "node": "node0",
            "event": "worker_failed",
            "exitcode": 1,
            "local_rank": 0,
            "pid": 7,
        },
        {"t": t0 + 12, "type": "agent", "node": "node0", "event": "rdzv_joining"},
        {"t": t0 + 12, "type": "agent", "node": "node1", "event": "rdzv_joining"},
        {
            "t": t0 + 30,
            "type": "agent",
            "node": "node1",
            "event": "keepalive_failed",
            "message": "The node 'node1_7_0' has failed to send a keep-alive heartbeat to the rendezvous",
        },
        {"t": t0 + 200, "type": "run", "event": "end"},
    ]
    found = diagnose(history, {})
    assert codes(found) == ["waiting-for-nodes"]
    wait = found[0]
    assert wait.title.endswith("too few live")
    assert "2 node(s) were live (node0, node1)" in wait.cause
    assert any("node2" in line and "container die" in line for line in wait.evidence)
    assert not any(line.startswith("etcd") for line in wait.evidence)
    assert any("keep-alive" in line for line in wait.evidence)


def test_a_spare_waiting_beside_a_training_job_is_not_waiting_for_nodes():
    t0 = 1_800_000_000.0
    history = [{"t": t0, "type": "agent", "node": "node3", "event": "rdzv_joining"}]
    history += [
        {"t": t0 + s, "type": "worker", "node": "node0", "event": "step", "n": s, "step": None}
        for s in range(1, 200, 10)
    ]
    assert diagnose(history, {}) == []


# --------------------------------------------------------------------------- (d) loss jump


def test_loss_jump_when_only_the_model_is_saved():
    """model_only_ckpt.py (Adam, model saved alone), c10d, store opt-out: one worker SIGKILLed at
    step 25, resumed from step 20; the side channel shows Adam's step count starting over at 1."""
    text = (LOGS / "loss_jump_model_only" / "node0.log").read_text()
    history = side_channel("loss_jump_model_only", "node0") + log_progress("node0", text)
    found = diagnose(history, {"node0": text})
    assert codes(found) == ["loss-jump"]
    jump = found[0]
    assert "optimizer's own step count started over at 1" in jump.cause
    assert "step 22 loss 2.238 after the restart" in evidence(jump)
    assert "optimizer state step 1 at its first step after the restart; it had reached" in evidence(jump)
    assert "optimizer.state_dict()" in jump.fix


def test_loss_jump_from_the_loss_alone():
    """Without the side channel (--no-instrument) the loss still tells."""
    text = (LOGS / "loss_jump_model_only" / "node0.log").read_text()
    found = diagnose(log_progress("node0", text), {"node0": text})
    assert codes(found) == ["loss-jump"]
    assert "rose from" in found[0].cause and "usual cause" in found[0].cause


def test_no_loss_jump_when_the_optimizer_is_restored():
    """ddp_sgd.py (SGD with momentum, model + optimizer saved), same fault: the resumed steps
    replay the same losses."""
    text = (LOGS / "loss_resume_ddp_sgd" / "node0.log").read_text()
    history = side_channel("loss_resume_ddp_sgd", "node0") + log_progress("node0", text)
    assert diagnose(history, {"node0": text}) == []


# --------------------------------------------------------------------------- (e) process-group timeout


def test_process_group_timeout_after_a_frozen_peer():
    """ddp_sgd.py at torch defaults, one agent, 2 workers: rank 1 SIGSTOPped at step 15; rank 0
    waits in its all-reduce for gloo's 30-minute default and fails."""
    found = diagnose([], logs("pg_timeout"))
    assert "process-group-timeout" in codes(found)
    hang = next(d for d in found if d.code == "process-group-timeout")
    assert "after waiting 30 min" in hang.cause
    assert hang.evidence[0] == (
        "node0 14:52:55.9  RuntimeError: Timed out waiting 1800000ms for recv operation to complete"
    )
    assert "timeout=timedelta" in hang.fix


def test_a_short_process_group_timeout_is_said_in_seconds():
    """The same capture with the timeout a scenario sets (pg_timeout 10): "after waiting 10 s", not "0 min"."""
    text = (LOGS / "pg_timeout" / "node0.log").read_text().replace("waiting 1800000ms", "waiting 10000ms")
    hang = next(d for d in diagnose([], {"node0": text}) if d.code == "process-group-timeout")
    assert "after waiting 10 s on node0" in hang.cause, hang.cause


def test_hang_while_a_node_is_frozen_before_any_timeout():
    """The live view: node1 paused, no step anywhere since (hand-written: 30 minutes of nothing)."""
    t0 = 1_800_000_000.0
    steps = [
        {"t": t0 + s, "type": "worker", "node": f"node{s % 2}", "event": "step", "n": s, "step": None}
        for s in range(1, 40)
    ]
    pause = [
        {"t": t0 + 40, "type": "fault", "op": "p1", "fault": "pause", "target": "node1", "phase": "invoke"},
        {"t": t0 + 40.2, "type": "fault", "op": "p1", "fault": "pause", "target": "node1", "phase": "ok"},
        {"t": t0 + 40.2, "type": "docker", "node": "node1", "action": "pause"},
        {"t": t0 + 400, "type": "run", "event": "end"},
    ]
    found = diagnose(steps + pause, {})
    assert codes(found) == ["process-group-timeout"]
    assert (
        found[0].evidence[0].startswith("node1 ")
        and "no training progress on any node for 360 s" in found[0].evidence[0]
    )


def test_a_short_pause_is_not_a_hang():
    t0 = 1_800_000_000.0
    steps = [
        {"t": t0 + s, "type": "worker", "node": "node0", "event": "step", "n": s, "step": None}
        for s in list(range(1, 40)) + list(range(52, 90))
    ]
    pause = [
        {"t": t0 + 40, "type": "fault", "op": "p1", "fault": "pause", "target": "node1", "phase": "ok"},
        {"t": t0 + 50, "type": "fault", "op": "u1", "fault": "unpause", "target": "node1", "phase": "ok"},
    ]
    assert diagnose(steps + pause, {}) == []


# --------------------------------------------------------------------------- (f) c10d store host


def test_c10d_store_host_lost():
    """c10d, two agents on one host: node0 (the store host, first to bind the endpoint) killed
    with its workers at step 15; node1 cannot reach the store and exits."""
    found = diagnose([], logs("c10d_store_host_lost"))
    assert codes(found) == ["c10d-store-lost"]
    lost = found[0]
    assert "(node1)" in lost.cause and "does not elect a new store host" in lost.cause
    assert "RendezvousConnectionError: The connection to the C10d store has failed" in evidence(lost)
    assert "etcd-v2" in lost.fix


def test_c10d_store_host_named_from_the_history():
    text = logs("c10d_store_host_lost")["node1"]
    t_kill = parse_docker_timestamp(text.splitlines()[-1])[0] - 1.0
    history = [
        run_start(t_kill - 30, rdzv_backend="c10d", nodes=2),
        {"t": t_kill, "type": "fault", "op": "k1", "fault": "kill-node", "target": "node0", "phase": "ok"},
    ]
    lost = diagnose(history, {"node1": text})[0]
    assert lost.title == "c10d rendezvous store lost with its host (node0)"
    assert lost.evidence[0].startswith("node0 ") and "fault kill-node on node0" in lost.evidence[0]


# --------------------------------------------------------------------------- (f2) etcd lost


def etcd_lost_history(backend: str = "etcd-v2") -> list[dict]:
    """The soak run's end (tests/data/logs/etcd_lost): etcd restarted, each node's container died 3 s later."""
    t = 1796105956.1882405
    dies = {"node1": 3.08, "node0": 3.30, "node2": 3.77}
    return [
        run_start(t - 900, rdzv_backend=backend, nodes=4),
        {"t": t, "type": "fault", "op": "r1", "fault": "restart-node", "target": "etcd", "phase": "ok"},
        *({"t": t + d, "type": "docker", "node": n, "action": "die", "exit_code": 1} for n, d in dies.items()),
    ]


def test_etcd_lost_ends_the_etcd_v2_agents():
    found = diagnose(etcd_lost_history(), logs("etcd_lost"))
    assert "etcd-lost" in codes(found)
    lost = next(d for d in found if d.code == "etcd-lost")
    assert "at 06:19:16.1 node0, node1, node2 ended" in lost.cause
    assert lost.evidence[0].startswith("etcd 06:19:16.1") and "fault restart-node on etcd" in lost.evidence[0]
    assert "RendezvousConnectionError: The connection to etcd has failed" in evidence(lost)
    assert "etcd-v3" in lost.fix and "c10d" in lost.fix


def test_etcd_lost_needs_an_etcd_agent_that_ended_on_it():
    assert "etcd-lost" not in codes(diagnose(etcd_lost_history("c10d"), logs("etcd_lost")))
    survived = [r for r in etcd_lost_history() if r.get("action") != "die"]  # the agents lived on
    assert "etcd-lost" not in codes(diagnose(survived, logs("etcd_lost")))


def test_etcd_lost_ends_the_etcd_v3_agents_after_reconnect_timeout():
    """etcd-loss-v3 scenario: etcd killed at step 20 and left down; both agents ended 30 s later."""
    found = diagnose(*captured_run("etcd_lost_v3"))
    assert codes(found) == ["etcd-lost"]  # not name-resolution: etcd's name went with its container
    lost = found[0]
    assert lost.title == "etcd unreachable past reconnect_timeout: the etcd-v3 agents ended"
    assert "for reconnect_timeout (30 s, counted from the first failed connect" in lost.cause
    assert "at 23:16:27.7 node0, node1 ended 30 s later" in lost.cause
    assert lost.evidence[0] == "etcd 23:16:27.7  fault kill-node on etcd (ok)"
    assert all("reconnect_timeout=30" in line for line in lost.evidence[1:]) and len(lost.evidence) == 3
    assert "reconnect_timeout=120" in lost.fix and "c10d" in lost.fix


# --------------------------------------------------------------------------- (g) etcd without v2


def test_etcd_without_v2_api():
    """etcd 3.4.23 started without --enable-v2; torchrun with --rdzv-backend etcd-v2 (node0.log)
    and etcd (node0-etcd-backend.log): python-etcd gets 404 on the v2 API."""
    for name in ("node0.log", "node0-etcd-backend.log"):
        found = diagnose([], logs("etcd_no_v2", node0=name))
        assert codes(found) == ["etcd-without-v2"], name
        assert "etcd.EtcdException: Bad response : 404 page not found" in evidence(found[0])
        assert "--enable-v2" in found[0].fix


# --------------------------------------------------------------------------- (h) spare agent


def test_spare_agent_attribute_error_at_job_end():
    """etcd-v2, --nnodes 1:1, two agents: node1 waits as a spare; when node0's job ends, node1
    exits 1 with torchrun's AttributeError."""
    found = diagnose([], logs("spare_agent"))
    assert codes(found) == ["spare-agent-exit"]
    spare = found[0]
    assert spare.title.endswith(": node1")
    assert spare.evidence == (
        "node1 14:05:21.2  The rendezvous 'h2job15056' is closed, terminating pending rendezvous.",
        "node1 14:05:21.2  AttributeError: 'NoneType' object has no attribute 'is_failed'",
    )


# --------------------------------------------------------------------------- clean runs, output


def test_a_clean_run_has_no_diagnosis():
    """ddp_sgd.py on two etcd-v2 agents, torch defaults, no fault, 40 steps."""
    clean = logs("clean_run")
    history = log_progress("node0", clean["node0"])
    assert diagnose(history, clean) == []
    assert diagnose([], {}) == []


def test_history_agent_records_are_used_when_no_log_is_given():
    from sim.core.agentlog import parse_node_log

    text = logs("spare_agent")["node1"]
    assert codes(diagnose(parse_node_log("node1", text), {})) == ["spare-agent-exit"]


def test_format_diagnoses():
    found = diagnose([], logs("restart_budget"))
    text = format_diagnoses(found, width=100)
    lines = text.splitlines()
    assert lines[0] == "Diagnosis 1/1 [restart-budget]: Restart budget used up on node1 (1 of 1)"
    assert lines[1].startswith("  cause:    torchrun counts restarts per agent")
    assert any(line.startswith("  evidence: node1 14:21:40.4  worker local_rank 0") for line in lines)
    assert any(line.startswith("  fix:      Give each agent") for line in lines)
    assert all(len(line) <= 100 for line in lines)
    assert format_diagnoses([]) == ""


# --------------------------------------------------------------------------- (i)-(k) disk, memory, checkpoints

RUNS = LOGS.parent / "runs"


def captured_run(case: str) -> tuple[list[dict], dict[str, str]]:
    """A sim run's history and saved node logs (tests/data/runs/, see its README)."""
    folder = RUNS / case
    history = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    return history, {path.stem: path.read_text() for path in sorted(folder.glob("node*.log"))}


def test_engine_lost_when_dockerd_stops_under_a_run():
    """`sim up --nodes 2`, then `pkill dockerd`: the engine's shutdown looks like a teardown (SIGTERM, kill),
    so the run is cut there; the collector's engine_lost record after it still names the cause."""
    found = diagnose(*captured_run("engine_lost"))
    assert codes(found) == ["engine-lost"]
    assert found[0].cause.startswith(
        "The Docker engine stopped answering at 23:12:17.2; the last progress before it at 23:12:17.0."
    )
    assert found[0].evidence[0].startswith("host 23:12:17.2  docker ps: Docker engine not reachable")


def test_disk_full_when_the_checkpoint_write_hits_enospc():
    """full-disk scenario: /ckpt filled at step 25, rank 0's next checkpoint write fails, filler removed 5 s later."""
    found = diagnose(*captured_run("full_disk"))
    assert codes(found) == ["disk-full"]
    full = found[0]
    assert full.title == "No space left on device: a write failed on node0"
    assert full.evidence == (
        "node0 17:48:09.3  fault fill-disk: filler file /ckpt/.sim-filler of 15 MiB written, the disk full",
        "node0 17:48:10.3  OSError: [Errno 28] No space left on device",
        "node0 17:48:11.3  worker local_rank 0 (pid 9) failed, exitcode 1",
    )
    assert "while the fill-disk fault had filled it" in full.cause
    assert "os.replace" in full.fix and "--ckpt-size" in full.fix


def test_disk_full_that_stays_burns_the_restart_budget():
    found = diagnose(*captured_run("full_disk_stays"))
    assert codes(found) == ["disk-full", "restart-budget"]
    assert "3 time(s)" in found[0].cause
    assert sum("Errno 28" in line for line in found[0].evidence) == 3


def test_oom_kill_from_dockers_oom_event_and_the_sigkilled_worker():
    found = diagnose(*captured_run("oom_worker"))
    assert codes(found) == ["oom-kill"]
    oom = found[0]
    assert oom.evidence == (
        "node1 17:59:47.7  Docker event oom: the kernel's OOM killer killed a process in the container",
        "node1 17:59:47.9  worker local_rank 0 (pid 9) failed, exitcode -9: SIGKILL from the OOM killer",
        "node1 17:59:47.9  fault oom-worker: memory limit 431 MiB, then memory pressure",
    )
    assert "(limit 431 MiB on node1)" in oom.cause and "on purpose" in oom.cause
    assert "--memory" in oom.fix


def test_oom_event_without_a_sigkilled_worker_is_no_oom_kill():
    history, logs_ = captured_run("oom_worker")
    late = [{**r, "t": r["t"] - 120} if r.get("action") == "oom" else r for r in history]
    assert "oom-kill" not in codes(diagnose(late, logs_))


def test_oom_kill_of_the_node_container_by_its_exit_code_137():
    history = [
        run_start(nodes=1),
        {"t": 10.0, "type": "docker", "node": "node0", "action": "oom"},
        {"t": 10.5, "type": "docker", "node": "node0", "action": "die", "exit_code": 137},
    ]
    found = diagnose(history, {})
    assert codes(found) == ["oom-kill"]
    assert "The oom-worker fault" not in found[0].cause


def corrupt_fault(t: float = 0.0) -> dict:
    result = {"node": "node0", "file": "/tmp/capckpt/ck/checkpoint.pt", "size": 6523, "mode": "truncate"}
    return {"t": t, "type": "fault", "op": "c1", "fault": "corrupt-checkpoint", "phase": "ok", "result": result}


def test_damaged_checkpoint_loaded_blindly_after_corrupt_checkpoint():
    """ddp_sgd.py (torch.save in place, torch.load with no check) after its checkpoint was truncated."""
    found = diagnose([corrupt_fault()], logs("blind_load_truncated"))
    assert codes(found) == ["damaged-checkpoint-loaded", "restart-budget"]
    blind = found[0]
    assert blind.title == "The script loads a damaged checkpoint blindly (node0)"
    assert blind.evidence[:3] == (
        "node0 00:00:00.0  fault corrupt-checkpoint: /tmp/capckpt/ck/checkpoint.pt damaged (truncate)",
        "node0 18:27:36.2  OSError: [Errno 22] Invalid argument",
        "node0 18:27:41.4  OSError: [Errno 22] Invalid argument",
    )
    assert "(OSError: [Errno 22] Invalid argument), 2 time(s)" in blind.cause
    for words in ("atomically", "os.replace", "keep the last K", "sha256", "fall back"):
        assert words in blind.fix


def test_a_load_error_without_a_checkpoint_fault_is_not_blamed_on_damage():
    assert "damaged-checkpoint-loaded" not in codes(diagnose([], logs("blind_load_truncated")))
    late = corrupt_fault(t=2e9)  # after every line of the log
    assert "damaged-checkpoint-loaded" not in codes(diagnose([late], logs("blind_load_truncated")))


def test_kill_during_checkpoint_named_in_the_evidence():
    kill = {
        **corrupt_fault(),
        "fault": "kill-during-checkpoint",
        "result": {"node": "node0", "pid": 9, "file": "/ckpt/checkpoint.pt", "size_at_kill": 100},
    }
    found = diagnose([kill], logs("blind_load_truncated"))
    assert found[0].evidence[0] == (
        "node0 00:00:00.0  fault kill-during-checkpoint: pid 9 killed while it wrote /ckpt/checkpoint.pt"
    )


def test_the_shipped_trainer_survives_damaged_checkpoints_with_no_diagnosis():
    """corrupt-checkpoint and kill-during-checkpoint scenarios: the trainer skips the damaged file."""
    assert diagnose(*captured_run("corrupt_checkpoint")) == []
    assert diagnose(*captured_run("kill_during_checkpoint")) == []


# --------------------------------------------------------------------------- (m) names that do not resolve


def test_name_resolution_when_etcd_stops_resolving_while_it_runs():
    found = diagnose([run_start(rdzv_backend="etcd-v3")], logs("name_resolution_etcd"))
    assert codes(found)[0] == "name-resolution"
    assert "(etcd)" in found[0].cause and "node0, node1" in found[0].title
    assert "Name or service not known" in evidence(found[0]) and "swarm" in found[0].fix


def test_name_resolution_when_workers_cannot_resolve_the_store_host():
    found = diagnose([run_start(rdzv_backend="etcd-v3")], logs("name_resolution_store"))
    assert codes(found)[0] == "name-resolution"
    assert "node0" in found[0].cause and "gai error: -2" in evidence(found[0])


def test_no_name_resolution_diagnosis_when_the_container_was_down():
    """etcd killed on purpose: its name leaves Docker's DNS with it; that is the fault, not this."""
    killed = {"t": 1796072000.0, "type": "docker", "node": "etcd", "action": "die", "exit_code": 137}
    found = diagnose([run_start(rdzv_backend="etcd-v3"), killed], logs("name_resolution_etcd"))
    assert "name-resolution" not in codes(found)


# --------------------------------------------------------------------------- (o) stuck at exit


def test_a_worker_that_never_exits_after_its_peer_finished_is_stuck_at_exit():
    """A CI run of dcp_ckpt.py: rank 0 exited 0 after the final DCP save; rank 1 hung in gloo's teardown."""
    found = diagnose(*captured_run("stuck_at_exit"))
    [stuck] = [d for d in found if d.code == "stuck-at-exit"]
    assert stuck.title == "A worker never ended after its peers finished the script: rank 1 on node1"
    assert stuck.evidence == (
        "node0 22:44:44.2  rank 0 exited 0",
        "node1 22:44:44.1  rank 1: last sign of life (activity); no exit after it",
        "node0 22:44:45.3  worker group finished; waiting for the other agents",
    )
    assert "silent for 252 s" in stuck.cause and "dist.barrier()" in stuck.fix


def test_a_worker_that_exits_or_is_taken_out_is_not_stuck():
    history, logs_ = captured_run("stuck_at_exit")
    node1 = [r for r in history if r.get("node") == "node1" and r.get("type") == "worker"][-1]
    exited = history + [{**node1, "t": node1["t"] + 1, "event": "exit", "code": 0}]
    assert "stuck-at-exit" not in codes(diagnose(exited, logs_))
    end = next(r for r in history if r.get("type") == "run" and r.get("event") == "end")
    early = [r for r in history if r["t"] < node1["t"] + 30] + [{**end, "t": node1["t"] + 30}]
    assert "stuck-at-exit" not in codes(diagnose(early, {}))  # not silent long enough yet


# --------------------------------------------------------------------------- (q) the script's own error


def test_script_error_nccl_missing_comes_first_with_the_users_frame():
    """`sim up --script` of a script calling init_process_group("nccl") on the CPU build (2 nodes, --max-restarts
    1): all four starts raise the same RuntimeError in the script's setup(); the fix is the emulation or --gpus."""
    found = diagnose(*captured_run("script_error_nccl"))
    assert codes(found) == ["script-error", "restart-budget"]
    error = found[0]
    assert error.title == (
        "The script fails at every start (it needs a GPU or NCCL, and this node has neither): "
        "RuntimeError: Distributed package doesn't have NCCL built in"
    )
    assert 'raised at /opt/sim/user/train.py:8 in setup (dist.init_process_group("nccl"))' in error.cause
    assert "ended 4 worker-group start(s) (2 on node0, 2 on node1)" in error.cause
    assert "restarts cannot help" in error.cause
    assert error.evidence[0] == (
        "node0 04:24:22.9  RuntimeError: Distributed package doesn't have NCCL built in at "
        '/opt/sim/user/train.py:8 in setup: `dist.init_process_group("nccl")`'
    )
    assert "--devices emulated" in error.fix and "--gpus" in error.fix


def test_restart_budget_gives_no_more_restarts_advice_for_a_script_error():
    budget = diagnose(*captured_run("script_error_nccl"))[1]
    assert budget.code == "restart-budget"
    assert "Every start failed the same way (RuntimeError: Distributed package" in budget.cause
    assert budget.fix.startswith("More restarts would not help")
    assert "--max-restarts" not in budget.fix
    # Without the script's error (a fault's failures), the advice stays.
    assert "--max-restarts" in diagnose([], logs("restart_budget"))[0].fix


def test_script_error_missing_module_names_requirements_image_and_project_dir():
    """`import yaml_not_here` at the top of the script: ModuleNotFoundError at line 2, every start."""
    error = diagnose(*captured_run("script_error_no_module"))[0]
    assert error.code == "script-error"
    assert error.title.endswith("(module yaml_not_here missing in the node): ModuleNotFoundError: No module named "
                                "'yaml_not_here'")  # fmt: skip
    assert "/opt/sim/user/train.py:2 in <module> (import yaml_not_here)" in error.cause
    assert "--requirements FILE" in error.fix and "--image IMAGE" in error.fix and "--project-dir DIR" in error.fix


def test_a_start_whose_agent_restarted_for_a_waiting_node_still_counts_as_ended_by_the_error():
    """A CI run (2026-12-05) of tests/integration/test_startup_crash.py: node1's first worker died of the missing
    module, but its agent saw node0 waiting first (new_nodes) and wrote no worker_failed; the worker's own exit
    (code 1) ended that start. The old diagnosis said "the first start(s) ran without it"."""
    error = diagnose(*captured_run("script_error_new_nodes_first"))[0]
    assert error.code == "script-error"
    assert error.title.startswith("The script fails at every start"), error.title
    assert "ended 4 worker-group start(s) (2 on node0, 2 on node1)" in " ".join(error.cause.split())
    assert "ran without it" not in error.cause


def test_script_error_missing_module_gives_the_pip_name():
    history, node_logs = captured_run("script_error_no_module")
    renamed = {node: text.replace("yaml_not_here", "yaml") for node, text in node_logs.items()}
    error = diagnose(history, renamed)[0]
    assert "(`pyyaml`)" in error.fix


def test_script_error_missing_config_names_mount_and_project_dir():
    """open("configs/train.json") relative to the worker's working directory, not the script's folder."""
    error = diagnose(*captured_run("script_error_no_config"))[0]
    assert error.code == "script-error" and "(a file missing in the node)" in error.title
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'configs/train.json'" in error.cause
    assert "/opt/sim/user/train.py:8 in load_config (with open(path) as f:)" in error.cause
    assert "configs/train.json is relative" in error.fix
    assert "--mount HOST:CONTAINER" in error.fix and "--project-dir DIR" in error.fix


def test_script_error_missing_host_path_says_it_is_on_your_machine():
    history, node_logs = captured_run("script_error_no_config")
    host = {
        node: text.replace("'configs/train.json'", "'/home/alice/data/train.json'") for node, text in node_logs.items()
    }
    error = diagnose(history, host)[0]
    assert error.fix.startswith("/home/alice/data/train.json is a path on your machine, not in the node.")


def test_script_error_write_into_the_read_only_script_folder():
    """torch.save into the script's own folder (mounted read-only): torch's zip writer fails, every start."""
    error = diagnose(*captured_run("script_error_read_only"))[0]
    assert error.code == "script-error" and "(a write into the read-only script folder)" in error.title
    assert "Read-only file system" in error.cause and "/opt/sim/user/train.py:8 in save" in error.cause
    assert "$SIM_CKPT_DIR (/ckpt" in error.fix and "--project-dir" in error.fix


def test_script_error_out_of_memory_under_the_emulation_names_the_nodes_memory():
    """torch.empty(4096, 32768, 8192, device="cuda") in the script's activation_buffer(), devices emulated: the
    node's allocator refused it, raised as CUDA's OutOfMemoryError; the fix adds the node's --memory."""
    found = diagnose(*captured_run("script_error_cuda_oom"))
    assert codes(found) == ["script-error", "restart-budget"]
    error = found[0]
    assert error.title.startswith(
        "The script fails at every start (out of memory): torch.OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 4096.00 GiB. (Emulated on CPU"
    )
    assert "/opt/sim/project/train.py:13 in activation_buffer (return torch.empty(batch, seq" in error.cause
    assert "ended 4 worker-group start(s) (2 on node0, 2 on node1)" in error.cause
    assert "smaller batch" in error.fix and "activation checkpointing" in error.fix
    assert "the memory that ran out is the node's" in error.fix and "`--memory SIZE`" in error.fix


def test_script_error_out_of_memory_on_a_real_gpu_keeps_to_the_gpus_fixes():
    """A real GPU's words (no GPU here to run out of memory on: the emulated capture's line swapped)."""
    history, node_logs = captured_run("script_error_cuda_oom")
    gpu = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"
    swapped = {n: re.sub(r"torch\.OutOfMemoryError: .*", gpu, t) for n, t in node_logs.items()}
    error = diagnose(history, swapped)[0]
    assert error.code == "script-error" and "(out of memory)" in error.title
    assert "expandable_segments" in error.fix and "--memory" not in error.fix


def test_script_error_a_cuda_extension_gives_the_emulations_own_words():
    """load_inline(..., cuda_sources=KERNEL) in the script's fused_ops(): the emulation refuses it and says why."""
    error = diagnose(*captured_run("script_error_cuda_extension"))[0]
    assert error.code == "script-error" and "(a CUDA feature the emulation cannot run)" in error.title
    assert "/opt/sim/project/train.py:8 in fused_ops (return load_inline(" in error.cause
    assert error.fix.startswith(
        "elastic-sim's device emulation says: a custom CUDA extension (torch.utils.cpp_extension.load_inline "
        "with CUDA sources) cannot run on the CPU emulation; run it on GPUs with --gpus"
    )


def test_no_script_error_when_one_start_fails_and_the_job_goes_on():
    """node0's log up to its second start: one start failed with the error. While a worker group started
    after it (node1's, from the history), nothing says every start fails; when none did, it ended the job."""
    history, node_logs = captured_run("script_error_nccl")
    node0 = node_logs["node0"].splitlines()
    second = next(i for i, line in enumerate(node0) if "restart_count=1" in line)
    first_start = {"node0": "\n".join(node0[:second])}
    assert "script-error" not in codes(diagnose(history, first_start))
    node0_only = [r for r in history if r.get("node") != "node1"]
    assert codes(diagnose(node0_only, first_start))[0] == "script-error"


def test_no_script_error_for_a_peers_loss_or_a_damaged_checkpoint():
    """Exceptions that follow a fault (a peer's reset connection, a blind load of a damaged file) are not the
    script's own: other diagnoses name them."""
    assert "script-error" not in codes(diagnose([], logs("shared_store_etcd_v2")))
    assert "script-error" not in codes(diagnose(*captured_run("corrupt_checkpoint")))
    assert "script-error" not in codes(diagnose(*captured_run("kill_during_checkpoint")))


# --------------------------------------------------------------------------- (r) a peer lost during init


def test_init_peer_lost_names_the_hold_in_init_process_group():
    """`sim up --detach` (torch defaults), then `sim kill node1` 4 s later, while node1's worker slept before its
    init_process_group and node0's waited inside it: node0 was held to the end of the run (7 min), with
    `hang FAIL` and `completed FAIL` and, before this diagnosis, no why."""
    found = diagnose(*captured_run("init_peer_lost"))
    assert codes(found) == ["init-peer-lost"]
    lost = found[0]
    assert lost.title == "A peer lost during process-group set-up held node0 in init_process_group for 428 s"
    assert "node1 was lost at 04:30:28.2 while the round's workers were still inside init_process_group" in lost.cause
    assert "30 minutes by default for gloo" in lost.cause
    assert lost.evidence[0].startswith("node1 04:30:28.2  fault kill-node on node1 (ok)")
    assert "no process group (pg_ready), step or collective after it" in lost.evidence[1]
    assert "timeout=timedelta(seconds=60)" in lost.fix


def test_no_init_peer_lost_once_the_group_is_up():
    """The same node kill after the process group was ready (pg_ready) is a fault in training, not in init."""
    history, node_logs = captured_run("init_peer_lost")
    kill = next(r for r in history if r.get("type") == "fault" and r.get("phase") == "ok")
    ready = [
        {**r, "t": kill["t"] - 1.0, "event": "pg_ready", "seconds": 1.0}
        for r in history
        if r.get("type") == "worker" and r.get("event") == "imported"
    ]
    assert "init-peer-lost" not in codes(diagnose(sorted(history + ready, key=lambda r: r["t"]), node_logs))


# --------------------------------------------------------------------------- every FAIL has a why

# Captured runs whose FAIL is the capture's own making, not a job's failure, each with its reason.
FAIL_EXPLAINED_ELSEWHERE = {
    "kill_during_checkpoint_x4": "a soak cut by its driver 5 s after its sixth fault, its target step (1,000,000) "
    "never meant to be reached: `completed` and the last fault's `recovery` fail on the cut",
}


def test_no_captured_fail_without_a_diagnosis():
    """Every captured run (tests/data/runs/) judged as `sim report` judges it: a FAIL must come with a why."""
    from sim.core.history import History
    from sim.verdict.runfolder import judge
    from sim.verdict.runmodel import RunModel

    unexplained = []
    for folder in sorted(p for p in RUNS.iterdir() if (p / "history.jsonl").exists()):
        contents = History(folder / "history.jsonl").read()
        run = RunModel(contents.records, skipped_lines=contents.skipped_lines)
        verdict, found = judge(run, {p.stem: p.read_text() for p in sorted(folder.glob("node*.log"))})
        found = [d for d in found if d.code != "unexplained"]  # "no known cause" is no why
        if not verdict.valid and not found and folder.name not in FAIL_EXPLAINED_ELSEWHERE:
            failed = ", ".join(
                f"{r.name} ({r.reasons[0] if r.reasons else ''})" for r in verdict.results if not r.valid
            )
            unexplained.append(f"{folder.name}: FAIL {failed}")
    assert not unexplained, "verdict FAIL with no diagnosis:\n" + "\n".join(unexplained)
    assert all((RUNS / name / "history.jsonl").exists() for name in FAIL_EXPLAINED_ELSEWHERE)


def test_init_peer_lost_with_a_timeout_given_to_init():
    """The same fault on a script that passes timeout=timedelta(seconds=45): node0's wait in init ends with
    `DistStoreError: wait timeout after 45000ms`, its agent regroups alone and the job ends well (verdict PASS)."""
    found = diagnose(*captured_run("init_peer_lost_timeout"))
    assert codes(found) == ["init-peer-lost", "last-call-wait"]
    lost = found[0]
    assert "then its workers failed (the error: a wait of 45 s, init's timeout)" in lost.cause
    assert "node0 04:41:51.6  torch.distributed.DistStoreError: wait timeout after 45000ms" in evidence(lost)
    assert lost.fix.startswith("The script gives init a timeout (45 s): the hold cost that long")


# --------------------------------------------------------------------------- (s) late join at the job's end


def test_late_join_at_end_names_the_joiners_rendezvous_closed_error():
    """2 nodes (max 3) of `script.py`; `sim scale --nodes 3` when node0 printed its step 78 of 80: both groups
    finished 1.2 s later and closed the rendezvous; node2's agent came up 2.7 s after the scale, found it
    closed and exited 1. The verdict: `completed FAIL node2's agent exited 1`, with no why until this."""
    found = diagnose(*captured_run("late_join_at_end"))
    assert codes(found) == ["late-join-at-end"]
    late = found[0]
    assert late.title == "node2 joined as the job ended: RendezvousClosedError, exit 1"
    assert "finished at 04:51:39.5 and they closed the rendezvous" in late.cause
    assert "every worker group of the last round succeeded" in late.cause
    assert late.evidence[0] == "nodes=3 04:51:38.3  fault scale (nodes=3): node2 joined"
    assert "node2 04:51:41.2  RendezvousClosedError: the rendezvous was closed" in late.evidence
    assert "node2 04:51:41.6  container die (exit code 1)" in late.evidence
    assert late.fix.startswith("Harmless to the training") and "sim scale" in late.fix


def test_late_join_needs_the_job_to_have_finished_first():
    """A RendezvousClosedError after a peer ran out of restarts (nobody finished) is not a late join."""
    assert "late-join-at-end" not in codes(diagnose([], logs("restart_budget")))
    history, node_logs = captured_run("late_join_at_end")
    unfinished = {
        n: "\n".join(x for x in t.splitlines() if "successfully finished" not in x) for n, t in node_logs.items()
    }
    assert "late-join-at-end" not in codes(diagnose(history, unfinished))


def test_late_join_names_the_finished_agents_wait_in_the_exit_barrier():
    """The capture with node0's container ending 300 s after its group finished (edited: the wait torch's exit
    barrier makes when the joiner was counted in a round; FACTS.md): the wait is named."""
    history, node_logs = captured_run("late_join_at_end")
    node0_end = {"type": "docker", "node": "node0", "action": "die"}
    moved = [{**r, "t": r["t"] + 300.0} if node0_end.items() <= r.items() else r for r in history]
    end = {"t": max(r["t"] for r in moved) + 1.0, "type": "run", "event": "end", "cluster": "h2-latejoin"}
    late = diagnose(sorted(moved, key=lambda r: r["t"]) + [end], node_logs)[0]
    assert late.code == "late-join-at-end"
    assert "The finished agents node0 waited in torch's exit barrier (up to 300 s" in late.cause
    assert "node0 04:51:39.5  finished, then waited 301 s in torch's exit barrier" in late.evidence


def test_script_error_that_comes_with_the_restarts():
    """The read-only capture with its first start's traceback taken out (edited), as if the first start had
    trained and only the restarted ones failed (a resume bug): named for every restart, pointing at the resume."""
    history, node_logs = captured_run("script_error_read_only")

    def without_first_traceback(text):
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
        end = next(i for i in range(start, len(lines)) if "Read-only file system" in lines[i])
        return "\n".join(lines[:start] + lines[end + 1 :])

    found = diagnose(history, {node: without_first_traceback(text) for node, text in node_logs.items()})
    assert codes(found)[0] == "script-error"
    error = found[0]
    assert error.title.startswith("The script fails at every restart (a write into the read-only script folder)")
    assert "ended 2 worker-group start(s) (1 on node0, 1 on node1)" in error.cause
    assert "The first start(s) ran without it" in error.cause and "the resume from its checkpoint" in error.cause


def test_script_error_cuda_calls_on_the_cpu_build():
    """Two more GPU-style starts on this CPU torch, captured: DDP(device_ids=[local_rank]) on a CPU module (a
    ValueError naming device_ids), and torch.cuda.set_device (the CPU build's torch._C has no _cuda_setDevice)."""
    for case, words in (
        ("script_error_device_ids", "ValueError: DistributedDataParallel device_ids and output_device arguments"),
        ("script_error_set_device", "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'"),
    ):
        found = diagnose(*captured_run(case))
        assert codes(found) == ["script-error", "restart-budget"], case
        error = found[0]
        assert words in error.title and "(it needs a GPU or NCCL, and this node has neither)" in error.title
        assert "--devices emulated" in error.fix and "--gpus" in error.fix
    error = diagnose(*captured_run("script_error_set_device"))[0]
    assert '/opt/sim/user/train.py:8 in <module> (torch.cuda.set_device(int(os.environ["LOCAL_RANK"])))' in error.cause


def test_no_script_error_for_an_exception_that_did_not_end_its_start():
    """A traceback with no worker failure after it in its start (caught, or "Exception ignored in ...")."""
    history, node_logs = captured_run("script_error_nccl")
    no_failures = {n: "\n".join(x for x in t.splitlines() if "failed (exitcode" not in x) for n, t in node_logs.items()}
    # Nor did the worker exit (its own "exit" record): it went on.
    history = [r for r in history if not (r.get("type") == "worker" and r.get("event") == "exit" and r.get("code"))]
    assert "script-error" not in codes(diagnose(history, no_failures))


def test_nccl_dead_peer_when_survivors_wait_out_the_timeout_after_a_node_loss():
    """tests/scripts/multinode-ddp-node-loss.yaml: multinode_ddp.py (nccl, emulated on CPU, timeout= 20 s); node2
    killed: node0's and node1's workers held their all-reduce 20 s, then aborted with the watchdog's words;
    both regrouped. The diagnosis names it and the timeout= fix with its trade-off."""
    found = diagnose(*captured_run("nccl_dead_peer"))
    assert codes(found) == ["nccl-dead-peer"]  # not process-group-timeout: no peer froze, one died
    dead = found[0]
    assert dead.title == "Survivors blocked 20 s in a collective after a peer died"
    assert "fault kill-node on node2" in dead.evidence[0]
    assert "rank 1 blocked in ALLREDUCE for 20.0 s (timeout 20 s)" in dead.evidence[1]
    # The script gives init a timeout: the fix says so, never "pass a timeout" (the watchdog's 20 s is not NCCL's
    # default: under emulation it is the script's).
    assert "The script gives init_process_group timeout=20 s" in dead.fix and "Pass timeout=" not in dead.fix
    assert "A lower timeout= shortens it" in dead.fix and "too short" in dead.fix and "too long" in dead.fix


def test_nccl_dead_peer_advises_a_timeout_only_to_a_script_that_gave_none():
    """The same capture, its watchdog at NCCL's default (600 s) and no timeout recorded: pass one."""
    history, node_logs = captured_run("nccl_dead_peer")
    history = [{**r, "timeout_s": 600.0} if r.get("event") == "nccl_watchdog" else r for r in history]
    dead = diagnose(history, node_logs)[0]
    assert dead.code == "nccl-dead-peer" and dead.fix.startswith("Pass timeout= to init_process_group")
    assert "(torch's default for NCCL: 10 minutes)" in dead.cause


def test_no_nccl_dead_peer_without_a_held_collective():
    assert "nccl-dead-peer" not in codes(diagnose(*captured_run("oom_worker")))


def _frozen_peer_run(timeout_s=None, released_after=None, steps_again_after=None, end_after=400.0):
    """Hand-made: 2 nodes x 1 worker training; node1's worker held before its next collective
    (hang-collectives) at t0 + 40; the script's init_process_group(timeout=timeout_s) recorded in pg_ready (None:
    none given); node0's worker released (NCCL's watchdog, emulated, and its agent's worker_failed)
    released_after s later or never; steps again steps_again_after s after the fault, or never."""
    t0 = 1_800_000_000.0
    worker = {"type": "worker", "world_size": 2, "restart": 0, "run_id": "r"}
    ready = {"seconds": 0.1} | ({"timeout_s": timeout_s} if timeout_s is not None else {})
    history = [{"t": t0, "type": "run", "event": "start", "spec": {"devices": "emulated"}}]
    history += [
        {**worker, "t": t0 + 1, "node": f"node{r}", "rank": r, "pid": 10 + r, "event": "pg_ready", **ready}
        for r in (0, 1)
    ]
    history += [
        {**worker, "t": t0 + 1 + s, "node": f"node{s % 2}", "rank": s % 2, "pid": 10 + s % 2, "event": "step", "n": s}
        for s in range(1, 39)
    ]
    fault = {"type": "fault", "op": "h1", "fault": "hang-collectives", "target": "node1"}
    history += [{**fault, "t": t0 + 40, "phase": "invoke"}, {**fault, "t": t0 + 40.6, "phase": "ok"}]
    if released_after is not None:
        t = t0 + 40 + released_after
        history += [
            {**worker, "t": t, "node": "node0", "rank": 0, "pid": 10, "event": "nccl_watchdog", "op": "ALLREDUCE",
             "seconds": timeout_s, "began": t - timeout_s, "timeout_s": timeout_s},
            {"t": t + 0.2, "type": "agent", "node": "node0", "event": "worker_failed", "exitcode": -6,
             "local_rank": 0, "pid": 10},
        ]  # fmt: skip
    if steps_again_after is not None:
        t = t0 + 40 + steps_again_after
        history += [
            {**worker, "t": t + i, "node": f"node{i % 2}", "rank": i % 2, "pid": 20 + i % 2, "restart": 1,
             "event": "step", "n": 39 + i}
            for i in range(10)
        ]  # fmt: skip
    return [*history, {"t": t0 + end_after, "type": "run", "event": "end"}]


def test_a_hang_held_past_the_scripts_timeout_names_the_group_with_its_own_timeout():
    """The script gives init_process_group timeout=15 s, yet the others are held 359 s without failing: the
    collective is in a group of its own timeout (new_group, a mesh's sub-groups): never "pass a timeout to
    init_process_group", which it does."""
    found = diagnose(_frozen_peer_run(timeout_s=15.0), {})
    assert codes(found) == ["process-group-timeout"]
    (hang,) = found
    assert "held 359 s without failing, although the script gives init_process_group timeout=15 s" in hang.cause
    assert "new_group()" in hang.cause and "30 minutes for gloo, 10 for NCCL" in hang.cause
    assert "init_process_group(timeout=15 s)" in hang.evidence[-1]
    assert "dist.new_group(ranks, timeout=timedelta(seconds=15))" in hang.fix and "backend_override" in hang.fix
    assert "Pass a timeout to init_process_group" not in hang.fix
    # Let go only at that group's own timeout (NCCL's 10 minutes): held that long, then failed.
    (late,) = diagnose(
        _frozen_peer_run(timeout_s=15.0, released_after=600.0, steps_again_after=650.0, end_after=800), {}
    )
    assert "they were held 599 s before their collective failed, although the script gives" in late.cause


def test_a_hang_the_scripts_timeout_ended_is_said_to_have_worked():
    """timeout=15 s: the watchdog (emulated) took node0's worker down 16 s after the freeze, and the job trained
    again 75 s after it (the silence was the restart). The fix: the timeout worked; lower it to shorten it."""
    found = diagnose(_frozen_peer_run(timeout_s=15.0, released_after=16.0, steps_again_after=75.0), {})
    assert codes(found) == ["process-group-timeout"]  # not nccl-dead-peer: no peer died, one froze
    (hang,) = found
    assert "until the process group's timeout, the 15 s the script gives init_process_group" in hang.cause
    assert "torchrun restarted the group: the rest of the silence was that restart" in hang.cause
    assert hang.fix.startswith("The script's timeout (15 s) bounds the wait, as designed")
    assert "Pass a timeout" not in hang.fix and "new_group" not in hang.fix


def test_a_hang_within_a_long_timeout_the_script_gave_says_it_waits_for_it():
    """hang-default-timeout.yaml's shape: the script gives 30 minutes; 360 s of silence, nothing let go yet."""
    (hang,) = diagnose(_frozen_peer_run(timeout_s=1800.0), {})
    assert "They wait for it until the process group's timeout, the 30 min the script gives" in hang.cause
    assert hang.fix.startswith("The script's timeout (30 min) bounds the wait") and "A lower timeout=" in hang.fix


def test_a_hang_in_a_script_that_gave_no_timeout_advises_one():
    (hang,) = diagnose(_frozen_peer_run(), {})
    assert hang.code == "process-group-timeout" and "30 minutes by default for gloo" in hang.cause
    assert hang.fix.startswith("Pass a timeout to init_process_group that suits the job")


def test_nccl_dead_peer_from_the_watchdog_lines_alone():
    """A real NCCL run writes no emulation records: the watchdog's own lines after the node loss say it."""
    history, logs = captured_run("nccl_dead_peer")
    history = [r for r in history if r.get("event") != "nccl_watchdog"]
    found = diagnose(history, logs)
    assert codes(found) == ["nccl-dead-peer"]
    assert found[0].title == "Survivors blocked 20 s in a collective after a peer died"
    assert "Watchdog caught collective operation timeout" in found[0].evidence[1]


def test_late_join_at_end_names_a_thawed_node_whose_rejoin_met_the_jobs_end():
    """zombie-rank0-late-heal (the old zombie-rank0 flake, on purpose): node0 frozen in a checkpoint write and
    woken once the others finished; it had trained in round 0, so it is named though not a new joiner, and its
    one failed rename is not a script error (the others' groups finished: not "every start")."""
    found = diagnose(*captured_run("zombie_late_heal"))
    assert codes(found) == ["process-group-timeout", "late-join-at-end"]
    late = found[1]
    assert late.title == "node0 joined as the job ended: RendezvousClosedError, exit 1"
    assert "without training in the last round" in late.cause
    assert "node0 14:06:04.5  agent entered the rendezvous" in late.evidence
    assert "node0 14:06:04.9  container die (exit code 1)" in late.evidence


# --------------------------------------------------------------------------- (t) lost before ranks, (u) last call


def test_node_lost_between_join_and_rank_assignment():
    """The seed-style job (etcd-v2, torch defaults but last_call_timeout=10, 3 nodes of 2, --nnodes 1:4): node1's
    worker killed; node0 killed 3 s after the three agents entered the regroup's round; the round completed with node0
    counted, and node1 and node2 waited 300 s in the EtcdStore for the rank assignment, then failed with LookupError."""
    found = diagnose(*captured_run("lost_before_ranks"))
    assert codes(found) == ["node-local-checkpoint", "lost-before-ranks", "last-call-wait"]
    lost = found[1]
    assert lost.title == "node0 lost between joining round 1 and its rank assignment: node1, node2 wait in the store"
    assert "the round completed with node0 counted (a world of 3 nodes; 2 came)" in lost.cause
    assert "_assign_worker_ranks" in lost.cause and "torchelastic/assigned_ranks/" in lost.cause
    assert "whose waits end after c10d's default store timeout (300 s; no --rdzv-conf key changes it)" in lost.cause
    assert "they waited 300 s, then their agents failed (LookupError: Key" in lost.cause
    assert lost.evidence[:3] == (
        "node0 05:32:44.4  node0 entered the rendezvous",
        "node0 05:32:48.1  fault kill-node on node0 (ok): node0 lost inside round 1, before it completed",
        "node1 05:32:55.5  joined round 1 as rank 1 in a world of 3 nodes, node0 counted; no rank assignment after it",
    )
    assert "TORCH_ELASTIC_WORKER_IDENTICAL=1" in lost.fix and "last_call_timeout" in lost.fix


def test_lost_before_ranks_needs_a_node_lost_inside_the_round():
    """Without the kill (its fault record and Docker's die of node0), the same capture has no such loss: silent."""
    history, node_logs = captured_run("lost_before_ranks")
    kept = [r for r in history if not (r.get("type") in ("fault", "docker") and "node0" in json.dumps(r))]
    assert "lost-before-ranks" not in codes(diagnose(kept, node_logs))


def test_waiting_for_nodes_is_not_the_story_when_enough_nodes_are_live():
    """The same capture on the old rules said "The rendezvous cannot complete until at least 1 nodes (--min-nodes)
    have joined; 3 node(s) were live": its premise (fewer live nodes than the minimum) is false, so it is silent;
    node3, scaled in, waits for a round the others never come back to."""
    found = diagnose(*captured_run("lost_before_ranks"))
    assert "waiting-for-nodes" not in codes(found)
    t0 = 1_800_000_000.0
    history = [run_start(t0, nodes=3, min_nodes=1)]
    history += [{"t": t0 + 10, "type": "agent", "node": "node3", "event": "rdzv_joining"}]
    history += [{"t": t0 + 200, "type": "run", "event": "end"}]
    assert "waiting-for-nodes" not in codes(diagnose(history, {}))
    history[0] = run_start(t0, nodes=3, min_nodes=4)  # the premise holds: 3 live < 4
    assert "waiting-for-nodes" in codes(diagnose(history, {}))


def test_last_call_wait_at_torch_defaults():
    """init_peer_lost_timeout: 2 nodes, --nnodes 1:2 at torch's defaults; node1 lost, node0 regrouped alone and its
    round completed 30.2 s after it entered it: the 30 s last call, waiting for a second node that never came."""
    found = diagnose(*captured_run("init_peer_lost_timeout"))
    wait = next(d for d in found if d.code == "last-call-wait")
    assert wait.title == "Regroup slowed by the last call (30 s): fewer than --max-nodes 2 nodes"
    assert "last_call_timeout (torch's default, 30 s)" in wait.cause and "--nnodes 1:2" in wait.cause
    assert wait.evidence == (
        "node0 04:41:52.0  after kill-node node1: the first agent entered the rendezvous",
        "node0 04:42:22.2  round 1 completed 30.2 s later with 1 of at most 2 nodes",
    )
    assert "last_call_timeout=2" in wait.fix and "--nnodes 2:2" in wait.fix


def test_last_call_wait_silent_without_a_last_call():
    """At --nnodes MAX:MAX a round completes as its last node joins, and a 2 s last call (the fast profile's) is not
    worth a diagnosis: the rule's premise is false in both."""
    history, node_logs = captured_run("init_peer_lost_timeout")
    start = next(r for r in history if r.get("type") == "run" and r.get("event") == "start")
    at_max = {**start, "spec": {**start["spec"], "min_nodes": 2}}
    assert "last-call-wait" not in codes(diagnose([at_max if r is start else r for r in history], node_logs))
    fast = {**start, "spec": {**start["spec"], "rdzv_conf": [["last_call_timeout", "2"]]}}
    assert "last-call-wait" not in codes(diagnose([fast if r is start else r for r in history], node_logs))


def test_a_failed_run_with_no_known_cause_is_unexplained_with_each_node_s_last_records():
    """The soak cut by its driver (kill_during_checkpoint_x4) fails with no diagnosis: `sim report` says so, and
    shows what each node's history said last, rather than nothing or a rule whose premise is false."""
    from sim.core.history import History
    from sim.verdict.runfolder import judge
    from sim.verdict.runmodel import RunModel

    folder = RUNS / "kill_during_checkpoint_x4"
    run = RunModel(History(folder / "history.jsonl").read().records)
    verdict, found = judge(run, {})
    assert not verdict.valid
    assert codes(found) == ["unexplained"]
    lines = found[0].evidence
    assert lines and {line.split()[0] for line in lines} >= {"node0", "node1"}
    assert "No known cause" in found[0].title


def test_node_lost_just_after_the_round_completed_is_lost_before_ranks_too():
    """A slower kill: node0 logged its own join of round 1, then was lost before the rank assignment. The same wait
    follows (its part of the assignment never comes), so the same cause is named, node0 not counted as waiting."""
    history, node_logs = captured_run("lost_before_ranks")
    node_logs.pop("node0")  # its agent records from the history, where the late join is added
    joined_t = min(r["t"] for r in history if r.get("event") == "rdzv_joined" and r.get("round") == 1)
    shifted = []
    for r in history:
        kill = r.get("type") == "fault" and r.get("fault") == "kill-node"
        died = r.get("type") == "docker" and r.get("node") == "node0" and r.get("action") in ("die", "kill")
        if (kill or died) and joined_t - 10 < r["t"] < joined_t:
            r = {**r, "t": joined_t + 1.0 + (r["t"] - 1_796_448_767.9)}  # after every join of round 1
        shifted.append(r)
    join = {"t": joined_t + 0.2, "type": "agent", "node": "node0", "event": "rdzv_joined", "round": 1,
            "group_rank": 0, "nodes": 3}  # fmt: skip
    found = diagnose(sorted([*shifted, join], key=lambda r: r["t"]), node_logs)
    lost = next(d for d in found if d.code == "lost-before-ranks")
    assert lost.title.startswith("node0 lost between joining round 1 and its rank assignment: node1, node2 wait")
    assert any("after it completed, before the rank assignment" in line for line in lost.evidence)

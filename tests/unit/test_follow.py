"""The compact follow view of `sim up`: history records -> lines, on hand-written records."""

import io
import json

from sim.cli.logs import FollowView, follow_job, live_run, nodes_up
from sim.core.history import RECORD_TYPES, parse_record
from sim.engines.cluster import ContainerInfo

T0 = 1000.0


def trainer(t, node, step, rank=0, kind="progress", **fields):
    return parse_record(
        {
            "t": T0 + t,
            "type": "trainer",
            "node": node,
            "kind": kind,
            "rank": rank,
            "local_rank": 0,
            "world_size": 2,
            "restart": 0,
            "step": step,
            "loss": 0.25,
            **fields,
        }
    )


def worker(t, node, event, rank=0, restart=0, **fields):
    return parse_record(
        {
            "t": T0 + t,
            "type": "worker",
            "node": node,
            "event": event,
            "rank": rank,
            "local_rank": 0,
            "world_size": 2,
            "restart": restart,
            "pid": 42,
            "run_id": "r",
            **fields,
        }
    )


def agent(t, node, event, **fields):
    return parse_record({"t": T0 + t, "type": "agent", "node": node, "event": event, **fields})


def lines(records, **view_options):
    view = FollowView(T0, **view_options)
    return [line for line in map(view.line, map(parse_record, records)) if line is not None]


def test_trainer_progress_rank0_every_tenth_step():
    records = [
        trainer(1, "node0", 10),
        trainer(1, "node1", 10, rank=1),
        trainer(1.2, "node0", 11),
        trainer(1.3, "node0", 11, kind="checkpoint"),
    ]
    assert lines(records) == ["    1.0s  node0  step 10 loss 0.2500 (world 2 restart 0)"]


def test_trainer_start_summary_and_warning():
    records = [
        trainer(1, "node0", None, kind="start", resumed_from=0),
        trainer(2, "node0", None, kind="start", resumed_from=30, restart=1),
        trainer(3, "node1", None, rank=1, kind="start", resumed_from=30),
        trainer(4, "node1", None, rank=1, kind="warning", message="checkpoint 40 is corrupt; using 30"),
        trainer(9, "node0", None, kind="summary", final_step=40, elapsed=8.04),
    ]
    assert [line[17:] for line in lines(records)] == [
        "trainer started from scratch (world 2 restart 0)",
        "trainer resumed from step 30 (world 2 restart 1)",
        "warning (rank 1): checkpoint 40 is corrupt; using 30",
        "trainer finished at step 40 after 8.0s",
    ]


def test_worker_steps_one_line_per_node_per_interval_and_at_each_restart():
    records = [
        worker(1, "node0", "step", n=1, step=None),
        worker(1.1, "node0", "step", rank=1, n=1, step=None),
        worker(1.2, "node1", "step", rank=2, n=1, step=None),
        worker(3, "node0", "step", n=9, step=None),
        worker(6.5, "node0", "step", n=20, step=None),
        worker(7, "node0", "step", restart=1, n=1, step=21),
    ]
    assert lines(records, interval_s=5.0) == [
        "    1.0s  node0  rank 0 optimizer step 1 of this process (world 2 restart 0)",
        "    1.2s  node1  rank 2 optimizer step 1 of this process (world 2 restart 0)",
        "    6.5s  node0  rank 0 optimizer step 20 of this process (world 2 restart 0)",
        "    7.0s  node0  rank 0 step 21 (world 2 restart 1)",
    ]


def test_activity_and_log_progress():
    records = [
        worker(1, "node0", "activity", collectives=1, op="all_reduce"),
        {"t": T0 + 2, "type": "worker", "node": "node1", "event": "progress", "step": 5, "loss": 1.5, "source": "log"},
    ]
    assert lines(records) == [
        "    1.0s  node0  rank 0 1 collective calls (last all_reduce) (world 2 restart 0)",
        "    2.0s  node1  step 5 loss 1.5000",
    ]


def test_a_richer_progress_source_silences_the_poorer_ones():
    records = [
        worker(1, "node0", "step", n=1, step=None),
        trainer(1.1, "node0", 10),
        worker(9, "node0", "step", n=30, step=None),
        worker(9.5, "node0", "activity", collectives=90, op="x"),
        trainer(12, "node0", 20),
    ]
    assert [line[17:] for line in lines(records)] == [
        "rank 0 optimizer step 1 of this process (world 2 restart 0)",
        "step 10 loss 0.2500 (world 2 restart 0)",
        "step 20 loss 0.2500 (world 2 restart 0)",
    ]


def test_rounds_restarts_and_failures():
    records = [
        agent(1, "node1", "rdzv_joined", round=2, group_rank=1, nodes=3),
        agent(
            1.1,
            "node1",
            "rdzv_complete",
            restart_count=1,
            group_rank=1,
            group_world_size=2,
            global_world_size=6,
            master_addr="node0",
        ),
        agent(1.2, "node1", "group_started"),
        agent(2, "node1", "worker_failed", exitcode=-9, local_rank=0, pid=77),
        agent(2.1, "node1", "worker_failed", exitcode=1, local_rank=1, pid=78),
        agent(2.2, "node1", "group_failed", attempts_left=2, max_restarts=3),
        agent(3, "node1", "group_failed", attempts_left=0, max_restarts=3),
        agent(4, "node2", "new_nodes", count=1),
        agent(5, "node2", "group_finished"),
        agent(6, "node2", "group_started"),
    ]
    assert [line[17:] for line in lines(records)] == [
        "joined rendezvous round 2 as node 1 of 3",
        "worker group started: world 6, restart 1",
        "worker local_rank 0 (pid 77) killed by SIGKILL",
        "worker local_rank 1 (pid 78) failed with exit code 1",
        "worker group failed: restarting (2/3 attempts left)",
        "worker group failed: no restarts left (--max-restarts 3)",
        "1 new node(s) waiting: the group will regroup",
        "worker group finished",
        "worker group started",
    ]


def test_errors_are_shown_clipped():
    long = "torch.distributed.elastic.rendezvous.api.RendezvousClosedError: " + "x" * 400
    records = [
        agent(1, "node0", "rdzv_closed", message=long),
        agent(2, "node0", "keepalive_failed", message="The node 'node0' failed to send a keep-alive"),
        agent(3, "node0", "error_file", message="time : 2026 | rank : 0 | exitcode : 1 | error_file: x"),
        worker(4, "node0", "exit", code=3),
        worker(4.1, "node0", "exit", code=0),
    ]
    out = [line[17:] for line in lines(records)]
    assert out[0].startswith("rendezvous closed: torch.distributed") and out[0].endswith("...") and len(out[0]) < 230
    assert out[1] == "keep-alive failed: The node 'node0' failed to send a keep-alive"
    assert out[2] == "root cause: time : 2026 | rank : 0 | exitcode : 1 | error_file: x"
    assert out[3] == "worker rank 0 exited with code 3"
    assert len(out) == 4


def test_faults_docker_events_and_run_end():
    fault = {"type": "fault", "op": "ab12", "fault": "kill-worker", "target": "node1"}
    records = [
        {"t": T0 + 1, **fault, "phase": "invoke", "args": {"signal": "KILL", "rank": None}},
        {"t": T0 + 1.1, **fault, "phase": "ok", "result": {"pid": 7}},
        {
            "t": T0 + 2,
            "type": "fault",
            "op": "cd34",
            "fault": "pause",
            "target": "node2",
            "phase": "fail",
            "error": "node2 is not running",
        },
        {"t": T0 + 3, "type": "docker", "node": "node1", "action": "die", "exit_code": 137},
        {"t": T0 + 3.1, "type": "docker", "node": "node1", "action": "oom"},
        {"t": T0 + 3.2, "type": "docker", "node": "node1", "action": "create"},
        {"t": T0 + 4, "type": "docker", "node": "node2", "action": "pause"},
        {"t": T0 + 5, "type": "run", "event": "end", "cluster": "demo"},
    ]
    assert lines(records) == [
        "    1.0s         fault kill-worker on node1: invoked (signal=KILL)",
        "    1.1s         fault kill-worker on node1: done",
        "    2.0s         fault pause on node2: failed: node2 is not running",
        "    3.0s  node1  container exited with code 137",
        "    3.1s  node1  container ran out of memory (OOM kill)",
        "    4.0s  node2  container paused (frozen)",
        "    5.0s         run ended: the cluster was removed",
    ]


def test_time_counts_from_the_first_record():
    view = FollowView()
    assert view.line(parse_record({"t": 50.0, "type": "run", "event": "start", "cluster": "c", "run_id": "r"})) is None
    assert view.line(agent(-T0 + 52.5, "node0", "group_finished")) == "    2.5s  node0  worker group finished"


def container(node, state, run_id="r1", role="node", status="Up 3 seconds", exit_code=None):
    return ContainerInfo(
        id=node, name=f"c-{node}", node=node, role=role, state=state, status=status, run_id=run_id, exit_code=exit_code
    )


def test_a_run_is_live_until_its_end_record():
    start = parse_record({"t": 1, "type": "run", "event": "start", "cluster": "demo", "run_id": "r1"})
    assert live_run([start, trainer(2, "node0", 10)]) == ("demo", "r1")
    assert live_run([start, parse_record({"t": 3, "type": "run", "event": "end", "cluster": "demo"})]) is None
    assert live_run([trainer(2, "node0", 10)]) is None


def test_nodes_up_counts_only_this_runs_nodes():
    containers = [
        container("etcd", "running", role="etcd"),
        container("node0", "running"),
        container("node1", "paused"),
        container("node2", "exited", status="Exited (0) 1 second ago", exit_code=0),
        container("node3", "running", run_id="older"),
    ]
    assert nodes_up(containers, "r1") == (2, 3)
    assert nodes_up(containers[3:4], "r1") == (0, 1)


class FinishedCluster:
    """What follow_job reads of a cluster whose nodes have all exited."""

    def __init__(self, run_dir):
        self.run_dir = run_dir

    def nodes(self):
        return [
            container("node0", "exited", status="Exited (0) 2 seconds ago", exit_code=0),
            container("node1", "exited", status="Exited (1) 2 seconds ago", exit_code=1),
        ]


def test_follow_job_prints_the_history_and_returns_when_every_node_exited(tmp_path):
    records = [
        {"t": T0, "type": "run", "event": "start", "cluster": "demo", "run_id": "r1"},
        agent(1, "node0", "group_started"),
        trainer(2, "node0", 10),
        trainer(2.1, "node0", 11),
    ]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(parse_record(r).to_dict()) + "\n" for r in records))
    out = io.StringIO()
    ended = follow_job(FinishedCluster(tmp_path), out, poll_s=0.01, quiet_s=0.05)
    assert out.getvalue().splitlines() == [
        "    1.0s  node0  worker group started",
        "    2.0s  node0  step 10 loss 0.2500 (world 2 restart 0)",
    ]
    assert ended.text == "job ended: every node container exited (exit codes: node0 0, node1 1)" and ended.stuck is None


def test_a_workers_exception_in_the_users_code_gets_a_line():
    """A traceback through the script (a frame in the user's files) is named as it happens; torchrun's own
    ChildFailedError (no user frame) is not."""
    records = [
        agent(
            2,
            "node0",
            "worker_exception",
            name="ModuleNotFoundError",
            message="No module named 'yaml'",
            frame="/opt/sim/user/train.py:2 in <module>",
            source="import yaml",
        ),
        agent(3, "node0", "worker_exception", name="torch.distributed.elastic.multiprocessing.errors.ChildFailedError"),
    ]
    assert lines(records) == [
        "    2.0s  node0  error: ModuleNotFoundError: No module named 'yaml' at /opt/sim/user/train.py:2 in <module>"
    ]


def test_every_record_type_has_a_named_handler():
    """The view's dispatch is a table over the record types (not method names built from a type's name):
    a new record type fails here until it is given a handler, or a None on purpose."""
    assert set(FollowView._HANDLERS) == set(RECORD_TYPES.values())

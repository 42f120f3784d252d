"""Parsing real torchrun 2.13 agent lines (captured from sim nodes) into history records."""

from pathlib import Path

from sim.core.agentlog import is_user_file, node_facts, parse_docker_timestamp, parse_node_log
from sim.core.history import AgentRecord, TrainerRecord
from sim.engines.collector import Collector

LOG = """\
2026-11-29T11:11:21.046000000Z I1129 11:11:21.046000 7 torch/distributed/elastic/agent/server/api.py:962] [default] Detected 3 new nodes from group_rank=0; will restart worker group
2026-11-29T11:11:22.120000000Z I2026-11-29 11:11:22,120 7 torch.distributed.elastic.rendezvous.dynamic_rendezvous] The node 'node0_7_0' has joined round 3 of the rendezvous 't-faults-bf9150-20261129-111038-cafb' as rank 0 in a world of size 4.
2026-11-29T11:11:22.949000000Z I1129 11:11:22.949000 7 torch/distributed/elastic/agent/server/api.py:553] [default] Rendezvous complete for workers. Result:
2026-11-29T11:11:22.949000000Z I1129 11:11:22.949000 7 torch/distributed/elastic/agent/server/api.py:553]   restart_count=1
2026-11-29T11:11:22.949000000Z I1129 11:11:22.949000 7 torch/distributed/elastic/agent/server/api.py:553]   master_addr=node0
2026-11-29T11:11:22.949000000Z I1129 11:11:22.949000 7 torch/distributed/elastic/agent/server/api.py:553]   group_rank=0
2026-11-29T11:11:22.949000000Z I1129 11:11:22.949000 7 torch/distributed/elastic/agent/server/api.py:553]   group_world_size=4
2026-11-29T11:11:22.949000000Z I1129 11:11:22.949000 7 torch/distributed/elastic/agent/server/api.py:553]   global_world_sizes=[8, 8]
2026-11-29T11:11:22.949000000Z I1129 11:11:22.949000 7 torch/distributed/elastic/agent/server/api.py:553] 
2026-11-29T11:11:22.950000000Z I1129 11:11:22.950000 7 torch/distributed/elastic/agent/server/api.py:715] [default] Starting worker group
2026-11-29T11:11:24.500000000Z {"sim": "progress", "t": 1795950684.5, "node": "node0", "rank": 0, "local_rank": 0, "world_size": 8, "restart": 1, "run_id": "r", "step": 41, "epoch": 0, "loss": 0.25}
2026-11-29T11:11:30.000000000Z E1129 11:11:30.000000 7 torch/distributed/elastic/multiprocessing/api.py:900] failed (exitcode: -9) local_rank: 1 (pid: 10) of binary: /opt/venv/bin/python3
2026-11-29T11:11:30.100000000Z W1129 11:11:30.100000 7 torch/distributed/elastic/agent/server/api.py:720] [default] Worker group FAILED. 3/3 attempts left; will restart worker group
2026-11-29T11:12:00.000000000Z I1129 11:12:00.000000 7 torch/distributed/elastic/agent/server/api.py:800] [default] worker group successfully finished. Waiting 300 seconds for other agents to finish.
"""


def test_docker_timestamps():
    t, body = parse_docker_timestamp("2026-11-29T11:11:22.120000000Z hello")
    assert body == "hello" and abs(t - 1795950682.12) < 1e-3
    assert parse_docker_timestamp("no stamp") == (None, "no stamp")


def test_agent_and_trainer_lines_become_records():
    records = parse_node_log("node0", LOG)
    events = [(r.TYPE, r.event if isinstance(r, AgentRecord) else r.kind) for r in records]
    assert events == [
        ("agent", "new_nodes"),
        ("agent", "rdzv_joined"),
        ("agent", "rdzv_complete"),
        ("agent", "group_started"),
        ("trainer", "progress"),
        ("agent", "worker_failed"),
        ("agent", "group_failed"),
        ("agent", "group_finished"),
    ]
    joined = records[1]
    assert (joined.round, joined.group_rank, joined.nodes) == (3, 0, 4)
    complete = records[2]
    assert (
        complete.restart_count,
        complete.group_rank,
        complete.group_world_size,
        complete.global_world_size,
        complete.master_addr,
    ) == (1, 0, 4, 8, "node0")
    progress = records[4]
    assert isinstance(progress, TrainerRecord)
    assert (progress.t, progress.step, progress.node, progress.loss) == (1795950684.5, 41, "node0", 0.25)
    assert (records[5].exitcode, records[5].local_rank, records[5].pid) == (-9, 1, 10)
    assert (records[6].attempts_left, records[6].max_restarts, records[6].restarts_used()) == (3, 3, 1)


def test_a_trainer_line_off_the_schema_is_no_record():
    line = '2026-11-29T11:11:24.500000000Z {"sim": "progress", "node": "node0", "step": "forty-one"}'
    assert parse_node_log("node0", line) == []


def test_node_facts_from_records():
    facts = node_facts(parse_node_log("node0", LOG))
    assert (facts.round, facts.group_rank, facts.nodes_in_round) == (3, 0, 4)
    assert facts.step == 41 and facts.world_size == 8 and facts.restarts == 1


def test_node_facts_count_restarts_as_the_agent_does_when_none_are_left():
    gave_up = AgentRecord(t=1.0, node="node0", event="group_failed", attempts_left=0, max_restarts=3)
    assert node_facts([gave_up]).restarts == 3  # at 0 left it gives up: all 3 used, not 4


def test_docker_events_become_records():
    collector = Collector.__new__(Collector)
    collector._nodes = {}
    die = {
        "Type": "container",
        "Action": "die",
        "id": "abc",
        "timeNano": 1795950684500000000,
        "Actor": {"ID": "abc", "Attributes": {"elastic-sim.node": "node2", "exitCode": "137", "name": "c-node2"}},
    }
    assert collector._docker_record(die).to_dict() == {
        "t": 1795950684.5,
        "type": "docker",
        "node": "node2",
        "action": "die",
        "exit_code": 137,
    }
    noise = {**die, "Action": "exec_start: python3 -c ..."}
    assert collector._docker_record(noise) is None
    connect = {
        "Type": "network",
        "Action": "disconnect",
        "timeNano": 1795950685000000000,
        "Actor": {"ID": "net", "Attributes": {"container": "abc", "name": "c_cluster"}},
    }
    assert collector._docker_record(connect).node == "node2"


# Captured from bare torchrun 2.13 agents (tests/data/logs/: shared_store_etcd_v2, spare_agent,
# etcd_no_v2, shared_store_hang), the lines the diagnoses read.
ERROR_LOG = """\
I1130 14:09:41.506000 15553 torch/distributed/elastic/agent/server/api.py:707] [default] Rendezvous'ing worker group
I1130 14:09:41.966000 15553 torch/distributed/elastic/agent/server/api.py:715] [default] Starting worker group
[E1130 14:09:46.788667013 ProcessGroupGloo.cpp:67] Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:5526$1
    backend_class = ProcessGroupGloo(
RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:5526$1
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:53991. This is typically caused by a remote worker crashing. Check the logs of the remote worker for the root cause.
I1130 14:09:47.831000 15553 torch/distributed/elastic/agent/server/api.py:715] [default] Starting worker group
RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:5526$1
I1130 14:05:21.251000 15060 torch/distributed/elastic/agent/server/api.py:751] Rendezvous gracefully exited: The rendezvous 'h2job15056' is closed, terminating pending rendezvous.
AttributeError: 'NoneType' object has no attribute 'is_failed'
etcd.EtcdException: Bad response : 404 page not found
W1130 14:32:50.835000 1694 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down workers
"""


def test_error_lines_become_records_once_per_attempt():
    records = parse_node_log("node1", ERROR_LOG)
    assert [(r.event, r.kind or r.name or r.signal) for r in records] == [
        ("rdzv_joining", None),
        ("group_started", None),
        ("worker_error", "gloo_connect"),
        ("worker_error", "peer_lost"),
        ("group_started", None),
        ("worker_error", "gloo_connect"),
        ("rdzv_graceful_exit", None),
        ("exception", "AttributeError"),
        ("exception", "etcd.EtcdException"),
        ("agent_signal", 15),
    ]
    assert records[2].message.endswith("Connection refused, remote=[127.0.0.1]:5526$1")
    assert records[6].message == "The rendezvous 'h2job15056' is closed, terminating pending rendezvous."
    assert records[7].message == "'NoneType' object has no attribute 'is_failed'"


# A worker's traceback through torch.load of a truncated zip checkpoint (torch 2.13, captured in
# tests/data/logs/blind_load_truncated/), then a save that hits a full disk inside torch.save.
LOAD_TRACEBACK = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/main/tests/scripts/ddp_sgd.py", line 61, in main
[rank0]:     checkpoint = torch.load(path, map_location="cpu")
[rank0]:   File "/work/main/.venv/lib/python3.11/site-packages/torch/serialization.py", line 1568, in load
[rank0]:     with _open_zipfile_reader(opened_file) as opened_zipfile:
[rank0]:   File "/work/main/.venv/lib/python3.11/site-packages/torch/serialization.py", line 807, in __init__
[rank0]:     super().__init__(torch._C.PyTorchFileReader(name_or_buffer))
[rank0]: OSError: [Errno 22] Invalid argument
I1130 18:27:36.275000 25715 torch/distributed/elastic/agent/server/api.py:715] [default] Starting worker group
[rank0]:   File "/work/main/.venv/lib/python3.11/site-packages/torch/serialization.py", line 967, in save
[rank0]: OSError: [Errno 28] No space left on device
[rank0]: ValueError: an unrelated error after the save
I1130 18:27:40.275000 25715 torch/distributed/elastic/agent/server/api.py:715] [default] Starting worker group
[rank0]: _pickle.UnpicklingError: invalid load key, '\\x00'.
RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory
"""


def test_checkpoint_load_and_disk_full_errors_become_worker_errors():
    records = [r for r in parse_node_log("node0", LOAD_TRACEBACK) if r.event != "worker_exception"]
    assert [(r.event, r.kind) for r in records] == [
        ("worker_error", "checkpoint_unreadable"),
        ("group_started", None),
        ("worker_error", "disk_full"),
        ("group_started", None),
        ("worker_error", "checkpoint_unreadable"),  # once per attempt: the next line is the same kind
    ]
    assert records[0].message == "[rank0]: OSError: [Errno 22] Invalid argument"
    assert records[2].message == "[rank0]: OSError: [Errno 28] No space left on device"


def test_a_failed_close_is_no_join_timeout():
    """torch's shutdown warning names the close's error type; a RendezvousTimeoutError there means etcd
    was away for close_timeout as the agent ended (seen in tour-v3), not that nodes failed to join."""
    log = (
        "2026-12-01T08:55:28.300000000Z W2026-12-01 08:55:28,300 7 torch.distributed.elastic.rendezvous."
        "dynamic_rendezvous] The node 'node2_7_0' has failed to shutdown the rendezvous 'r' due to an error of "
        "type RendezvousTimeoutError.\n"
        "2026-12-01T08:55:28.400000000Z torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n"
    )
    events = [r.event for r in parse_node_log("node2", log)]
    assert events == ["rdzv_close_failed", "rdzv_timeout"]


def test_a_traceback_becomes_its_exception_and_the_users_last_frame():
    """The exception line ends a traceback: its type and message, and the last frame outside the Python
    library, site-packages and the node image's hooks, with its source line (3.11's ^^^ marks skipped)."""
    exceptions = [r for r in parse_node_log("node0", LOAD_TRACEBACK) if r.event == "worker_exception"]
    assert [(r.name, r.message) for r in exceptions] == [("OSError", "[Errno 22] Invalid argument")]
    assert exceptions[0].frame == "/work/main/tests/scripts/ddp_sgd.py:61 in main"
    assert exceptions[0].source == 'checkpoint = torch.load(path, map_location="cpu")'


def test_a_traceback_with_no_user_frame_and_an_agent_line_inside_it():
    log = (
        "Traceback (most recent call last):\n"
        '  File "/opt/venv/bin/torchrun", line 8, in <module>\n'
        "    sys.exit(main())\n"
        "             ^^^^^^\n"
        "I1202 04:24:27.631000 7 torch/distributed/elastic/agent/server/api.py:733] [default] Stopping worker group\n"
        '  File "/opt/venv/lib/python3.11/site-packages/elastic_sim_instrument.py", line 290, in init_process_group\n'
        "    result = original(*args, **kwargs)\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "not a traceback line\n"
    )
    exceptions = [r for r in parse_node_log("node0", log) if r.event == "worker_exception"]
    assert [(r.name, r.message, r.frame, r.source) for r in exceptions] == [
        ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError", "", None, None)
    ]
    assert is_user_file("/opt/sim/user/train.py") and is_user_file("/home/sim/project/mypkg/model.py")
    assert not is_user_file("/usr/lib/python3.11/json/__init__.py")
    assert not is_user_file("<frozen importlib._bootstrap>")


def test_a_record_decorated_script_still_prints_its_traceback():
    """With torch's @record the worker writes an error file (torchrun's root-cause block quotes it) and its
    traceback still reaches stderr: each start gives one worker_exception in the user's frame."""
    text = (Path(__file__).resolve().parent.parent / "data" / "logs" / "script_error_record" / "node0.log").read_text()
    records = parse_node_log("node0", text)
    mine = [r for r in records if r.event == "worker_exception" and r.frame]
    assert [(r.name, r.message, r.frame, r.source) for r in mine] == [
        ("ModuleNotFoundError", "No module named 'yaml_missing_here'", "/tmp/h2-rec/train.py:6 in main",
         "import yaml_missing_here  # noqa"),
    ] * 2  # fmt: skip
    [root_cause] = [r for r in records if r.event == "error_file"]
    assert "traceback : Traceback (most recent call last):" in root_cause.message

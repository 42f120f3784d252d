"""Facts read from a node's log: the torchrun agent's own INFO lines and the
trainer's JSON lines. Pure functions of text, unit-tested on captured lines."""

from __future__ import annotations

import dataclasses
import re

from .cluster import iter_json_lines

# torch/distributed/elastic/rendezvous/dynamic_rendezvous.py (etcd-v2, c10d)
JOINED_ROUND = re.compile(r"has joined round (\d+) of the rendezvous '([^']*)' as rank (\d+) in a world of size (\d+)")
# torch/distributed/elastic/agent/server/api.py
GROUP_FAILED = re.compile(r"Worker group FAILED\. (\d+)/(\d+) attempts left")
NEW_NODES = re.compile(r"Detected (\d+) new nodes")


@dataclasses.dataclass
class NodeLogFacts:
    round: int | None = None
    group_rank: int | None = None
    nodes_in_round: int | None = None
    world_size: int | None = None  # trainers, from the newest progress line
    restarts: int = 0
    step: int | None = None
    finished: bool = False


def node_log_facts(text: str) -> NodeLogFacts:
    facts = NodeLogFacts()
    for line in text.splitlines():
        joined = JOINED_ROUND.search(line)
        if joined:
            facts.round = int(joined.group(1))
            facts.group_rank = int(joined.group(3))
            facts.nodes_in_round = int(joined.group(4))
            continue
        failed = GROUP_FAILED.search(line)
        if failed:
            left, total = int(failed.group(1)), int(failed.group(2))
            facts.restarts = max(facts.restarts, total - left + 1) if left > 0 else total
    for record in iter_json_lines(text):
        kind = record.get("sim")
        if kind == "progress":
            facts.step = record.get("step", facts.step)
            facts.world_size = record.get("world_size", facts.world_size)
            facts.restarts = max(facts.restarts, int(record.get("restart") or 0))
        elif kind == "summary":
            facts.finished = True
    return facts

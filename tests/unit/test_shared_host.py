"""Safe on a shared machine, part two (issue 37): the pure logic behind the real-engine tests in
tests/integration/test_shared_host.py."""

from __future__ import annotations

import yaml

from sim.core.spec import ClusterSpec
from sim.engines.render import render, to_yaml
from sim.engines.swarm_render import SwarmLayout, to_stack

IMAGES = {"node_image": "node:t", "etcd_image": "etcd:t", "run_id": "r1"}


def test_the_stack_file_escapes_every_string_once_what_it_adds_included():
    spec = ClusterSpec(name="demo", nodes=2, env=(("PRICE", "$5"),))
    layout = SwarmLayout(ckpt_nfs="10.0.0.5:/srv/${HOME}")
    project = render(spec, **IMAGES)
    stack = to_stack(project, layout, max_nodes=2)
    # `docker stack deploy` interpolates as Compose does: `$$` is one `$` to it.
    assert stack["volumes"]["ckpt"]["driver_opts"]["device"] == ":/srv/$${HOME}"
    assert stack["services"]["node0"]["environment"]["PRICE"] == "$$5"
    assert to_stack(yaml.safe_load(to_yaml(project)), layout, max_nodes=2) == stack

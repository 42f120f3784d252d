"""--env values masked wherever others read them (issue 26 finding 8): the start record, saved logs,
the collector's lines; --env-show keeps them; the verdict's own switch stays readable."""

from __future__ import annotations

import pytest

from sim.core.spec import ENV_SHOWN_KEYS, ClusterSpec, spec_from_options
from sim.engines.cluster import redact_file, run_start_record
from sim.verdict.diagnoses.rendezvous import STORE_OPT_OUT

ENV = (("HF_TOKEN", "hf_s3cretvalue"), ("NCCL_DEBUG", "INFO"), (STORE_OPT_OUT, "1"), ("DB_PASSWORD", "pa55word"))


def test_the_start_record_masks_every_value_but_the_verdicts_switch():
    spec = ClusterSpec(env=ENV)
    recorded = dict(map(tuple, run_start_record(spec, "r1", None)["spec"]["env"]))
    assert recorded == {"HF_TOKEN": "***", "NCCL_DEBUG": "***", STORE_OPT_OUT: "1", "DB_PASSWORD": "***"}
    assert "hf_s3cretvalue" not in str(run_start_record(spec, "r1", None))
    assert dict(ClusterSpec.from_json(spec.to_json()).env)["HF_TOKEN"] == "hf_s3cretvalue"  # spec.json, 0600
    shown = spec_from_options({"env": ["HF_TOKEN=hf_s3cretvalue"], "env_show": True}, None)
    assert dict(map(tuple, run_start_record(shown, "r1", None)["spec"]["env"])) == {"HF_TOKEN": "hf_s3cretvalue"}
    assert STORE_OPT_OUT in ENV_SHOWN_KEYS


def test_redact_hides_long_values_only_and_env_show_hides_none():
    spec = ClusterSpec(env=ENV)
    assert spec.redact("token=hf_s3cretvalue pw=pa55word level=INFO") == "token=*** pw=*** level=***"
    assert spec.redact("x=1") == "x=1"  # too short to find without garbling every line
    assert ClusterSpec(env=ENV, env_show=True).redact("hf_s3cretvalue") == "hf_s3cretvalue"


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
def test_redact_file_finds_a_value_split_across_reads(tmp_path, chunk):
    path = tmp_path / "node0.log"
    path.write_bytes(b"a hf_s3cretvalue b\n" * 3 + b"hf_s3cretvalu" + b"pa55word")
    redact_file(path, ["hf_s3cretvalue", "pa55word"], chunk=chunk)
    assert path.read_bytes() == b"a *** b\n" * 3 + b"hf_s3cretvalu***"

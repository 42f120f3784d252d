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


# --- the etcd-v3 password (issue 37 finding 6) ----------------------------------------------------------

PASSWORD = "rdzv-pa55-w0rd"
V3 = ClusterSpec(
    rdzv_backend="etcd-v3",
    rdzv_conf=(("join_timeout", "60"), ("user", "root"), ("password", PASSWORD), ("allow_plain_password", "1")),
)


def test_the_rdzv_password_is_masked_in_the_start_record_and_redacted_from_lines():
    recorded = run_start_record(V3, "r1", None)
    assert PASSWORD not in str(recorded)
    assert dict(map(tuple, recorded["spec"]["rdzv_conf"])) == {
        "join_timeout": "60",
        "user": "root",
        "password": "***",
        "allow_plain_password": "1",
    }  # the settings the verdict reads stay readable
    assert V3.redact(f"rdzv_configs={{'password': '{PASSWORD}'}}") == "rdzv_configs={'password': '***'}"
    # --env-show shows --env values, never the password.
    shown = ClusterSpec(rdzv_conf=V3.rdzv_conf, env=(("A", "value-a"),), env_show=True)
    assert shown.secret_values() == [PASSWORD]


def test_the_rdzv_password_reaches_torchrun_in_its_environment_not_its_command_line():
    from sim.core.spec import RDZV_PASSWORD_ENV, is_secret_key
    from sim.engines.render import render
    from tests.unit.test_render import IMAGES

    node = render(V3, **IMAGES)["services"]["node0"]
    assert PASSWORD not in " ".join(node["command"])
    assert f"password_env={RDZV_PASSWORD_ENV}" in " ".join(node["command"])
    assert node["environment"][RDZV_PASSWORD_ENV] == PASSWORD
    assert "user=root" in " ".join(node["command"])
    keys = ("password", "api_key", "TOKEN", "join_timeout", "user", "allow_plain_password")
    assert [k for k in keys if is_secret_key(k)] == [
        "password",
        "api_key",
        "TOKEN",
    ]

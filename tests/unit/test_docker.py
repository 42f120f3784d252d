"""The docker SDK provider's own logic, on a fake API client (no engine)."""

from __future__ import annotations

import docker.errors as sdk_errors
import pytest
import requests
import urllib3

from sim.engines import docker as provider
from sim.engines.docker import DockerError


class RefusingApi:
    """An engine whose first `refusals` pauses fail with the given runtime message."""

    def __init__(self, refusals: int, message: str):
        self.refusals, self.message, self.pauses = refusals, message, 0

    def pause(self, container: str) -> None:
        self.pauses += 1
        if self.pauses <= self.refusals:
            response = requests.Response()
            response.status_code = 500
            raise sdk_errors.APIError("500", response=response, explanation=self.message)


def engine(api) -> provider.Docker:
    docker = provider.Docker()
    docker.__dict__["api"] = api  # the cached client
    return docker


FREEZE_REFUSAL = "Cannot pause container c1: OCI runtime pause failed: unable to freeze: unknown"


def test_pause_asks_again_when_runc_could_not_freeze_in_time(monkeypatch):
    monkeypatch.setattr(provider.time, "sleep", lambda s: None)
    api = RefusingApi(refusals=3, message=FREEZE_REFUSAL)
    engine(api).pause("c1")
    assert api.pauses == 4


def test_pause_gives_up_after_its_attempts_with_the_engines_reason(monkeypatch):
    monkeypatch.setattr(provider.time, "sleep", lambda s: None)
    api = RefusingApi(refusals=100, message=FREEZE_REFUSAL)
    with pytest.raises(DockerError, match="docker pause failed: .*unable to freeze"):
        engine(api).pause("c1")
    assert api.pauses == provider.FREEZE_ATTEMPTS


def test_pause_does_not_repeat_any_other_refusal(monkeypatch):
    monkeypatch.setattr(provider.time, "sleep", lambda s: None)
    api = RefusingApi(refusals=1, message="Container c1 is not running")
    with pytest.raises(DockerError, match="is not running"):
        engine(api).pause("c1")
    assert api.pauses == 1


def test_an_unreachable_engine_is_named_by_the_innermost_os_error():
    nested = requests.exceptions.ConnectionError(
        urllib3.exceptions.ProtocolError("Connection aborted.", FileNotFoundError(2, "No such file or directory"))
    )
    assert str(provider._unreachable("ps", nested)).startswith(
        "docker ps: Docker engine not reachable (No such file or directory); "
    )
    plain = requests.exceptions.ConnectionError("ssh: connect to host hostb port 22: Connection timed out")
    assert "(ssh: connect to host hostb port 22: Connection timed out)" in str(provider._unreachable(None, plain))

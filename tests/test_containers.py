"""Docker without a Docker engine: which server the tests pick, and what an image build takes
from the build machine.  The images and the compose cluster themselves are tested by
`make test-containers` (tests/test_cluster.py and the server-side tests on containers)."""

from __future__ import annotations

import pytest

from madlib_mop.tools.containers import pip_index_settings
from tests import conftest


def test_the_embedded_server_is_the_default_whether_or_not_an_engine_answers(monkeypatch):
    monkeypatch.delenv("MADLIB_MOP_DSN", raising=False)
    monkeypatch.delenv(conftest.TEST_SERVER_VARIABLE, raising=False)
    assert conftest._server_kind() == "embedded"
    monkeypatch.setenv(conftest.TEST_SERVER_VARIABLE, "container")
    assert conftest._server_kind() == "container"
    monkeypatch.setenv("MADLIB_MOP_DSN", "postgresql://someone@dbhost/x")
    assert conftest._server_kind() == "dsn"  # the user's server wins
    monkeypatch.delenv("MADLIB_MOP_DSN")
    monkeypatch.setenv(conftest.TEST_SERVER_VARIABLE, "docker")
    with pytest.raises(pytest.UsageError, match="embedded, container"):
        conftest._server_kind()


def test_an_image_build_takes_the_machines_index_urls_and_not_its_paths():
    lines = ["global.index-url='https://mirror.example/simple'",
             "global.extra-index-url='file:///opt/pypi/simple https://more.example/simple'",
             "global.find-links='/opt/wheels'", "global.constraint='/etc/xdg/pip/constraints.txt'",
             "global.cert='/etc/ssl/certs/ca-certificates.crt'", ":env:.default-timeout='180'",
             ":env:.extra-index-url='file:///only/here'"]
    assert pip_index_settings(lines) == {"index-url": "https://mirror.example/simple",
                                         "extra-index-url": "https://more.example/simple",
                                         "default-timeout": "180"}

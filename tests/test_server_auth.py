"""The DBA's pg_hba.conf / pg_ident.conf edits (madlib_mop.tools.server_auth), without a server."""

from __future__ import annotations

import pytest

from madlib_mop.tools import server_auth
from madlib_mop.tools.server_auth import AuthConfigError, hba_text, ident_text

DEBIAN = """local   all             postgres                                peer
# TYPE  DATABASE        USER            ADDRESS                 METHOD
local   all             all                                     peer
host    all             all             127.0.0.1/32            scram-sha-256
"""


def test_the_socket_line_gets_the_map_once():
    once = hba_text(DEBIAN)
    rules = [line.split() for line in once.splitlines() if line and not line.startswith("#")]
    assert rules == [["local", "all", "postgres", "peer"],
                     ["local", "all", "all", "peer", "map=madlib_mop"],
                     ["host", "all", "all", "127.0.0.1/32", "scram-sha-256"]]
    assert hba_text(once) == once


def test_a_file_without_debians_socket_line_is_not_guessed_at():
    with pytest.raises(AuthConfigError, match="local all all peer"):
        hba_text("local all all scram-sha-256\n")


def test_the_map_keeps_identity_and_adds_each_role_once():
    text = ident_text("", "postgres", ["alice", "Bob Smith", "alice"])
    lines = [line.split(None, 2) for line in text.splitlines() if line and not line.startswith("#")]
    assert lines == [["madlib_mop", "/^(.*)$", "\\1"], ["madlib_mop", "postgres", "alice"],
                     ["madlib_mop", "postgres", '"Bob Smith"']]
    assert ident_text(text, "postgres", ["alice"]) == text


@pytest.mark.parametrize("role", ["", "a\nb", "x\r"])
def test_role_names_that_would_add_lines_are_refused(role):
    with pytest.raises(AuthConfigError):
        ident_text("", "postgres", [role])


def test_command_line(tmp_path, capsys):
    hba, ident = tmp_path / "pg_hba.conf", tmp_path / "pg_ident.conf"
    hba.write_text(DEBIAN)
    ident.write_text("")
    assert server_auth.main(["configure", str(hba), str(ident)]) == 0
    assert server_auth.main(["allow", str(ident), "alice"]) == 0
    assert "madlib_mop      postgres                alice" in ident.read_text()
    assert server_auth.main(["allow", str(ident), "alice"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "unchanged"

"""Clients configured from the environment (as the Helm chart does): the token reaches a real server."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from ragr1.services.common.client import ChannelOptions
from tests.common.status_process import start_server, status_code


def test_token_file_from_the_environment_authenticates(tmp_path: Path, port: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-a-secret\n")
    with start_server(tmp_path, port, "--auth-token-file", str(token_file)):
        target = f"127.0.0.1:{port}"
        assert status_code(target, ChannelOptions()) == grpc.StatusCode.UNAUTHENTICATED
        monkeypatch.setenv("RAGR1_CLIENT_TOKEN_FILE", str(token_file))
        assert ChannelOptions().token == "from-a-secret"
        assert status_code(target, ChannelOptions()) == grpc.StatusCode.OK
        # An explicit argument wins over the environment.
        assert status_code(target, ChannelOptions(token="wrong")) == grpc.StatusCode.UNAUTHENTICATED


def test_missing_or_empty_token_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGR1_CLIENT_TOKEN_FILE", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="RAGR1_CLIENT_TOKEN_FILE"):
        ChannelOptions()
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv("RAGR1_CLIENT_TOKEN_FILE", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="is empty"):
        ChannelOptions()

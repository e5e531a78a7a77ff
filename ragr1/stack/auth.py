"""Auth for the local stack (``ragr1 up --auth``): a bearer token between the services and a Redis
password, both random, each in a file of the run folder that only its owner reads.

Every service gets the paths through the environment the chart and compose use
(``RAGR1_AUTH_TOKEN_FILE`` for its server, ``RAGR1_CLIENT_TOKEN_FILE`` for its clients,
``RAGR1_REDIS_PASSWORD_FILE`` for the queue): paths, never the secrets, so that neither a command line
(``ps`` shows it to every user) nor an environment dump nor a log holds one.
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

from ragr1.services.common.client import TOKEN_ENV, ChannelOptions
from ragr1.services.common.config import env_name, write_secret
from ragr1.services.common.wire import read_secret

# The setting of every server (ServerConfig) and of the queue's users (QueueConfig) that the files feed.
SERVER_TOKEN_ENV = env_name("auth_token_file")
REDIS_PASSWORD_ENV = env_name("redis_password_file")


def _secret_file(path: Path) -> Path:
    """A new random secret in ``path`` (mode 0600), or the one already there (a stack started again in
    the same run folder keeps its secrets)."""
    if not path.exists():
        write_secret(path, secrets.token_urlsafe(32) + "\n")
    path.chmod(0o600)
    read_secret(str(path), path.name)  # an empty file left by a crash is an error, not a blank secret
    return path


@dataclasses.dataclass(frozen=True)
class StackAuth:
    token_file: Path
    redis_password_file: Path

    @classmethod
    def create(cls, directory: Path) -> StackAuth:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.chmod(0o700)
        return cls(_secret_file(directory / "token"), _secret_file(directory / "redis-password"))

    def env(self) -> dict[str, str]:
        """What every service's environment gets."""
        token = str(self.token_file)
        return {SERVER_TOKEN_ENV: token, TOKEN_ENV: token, REDIS_PASSWORD_ENV: str(self.redis_password_file)}

    @property
    def token(self) -> str:
        return read_secret(str(self.token_file), "token file")

    @property
    def redis_password(self) -> str:
        return read_secret(str(self.redis_password_file), "Redis password file")

    def channel_options(self) -> ChannelOptions:
        """For the stack owner's own gRPC clients (the demo's, the harnesses')."""
        return ChannelOptions(token=self.token)

    def describe(self) -> dict[str, str]:
        """Where the secrets are (for endpoints.json): the paths only."""
        return {"token_file": str(self.token_file), "redis_password_file": str(self.redis_password_file)}

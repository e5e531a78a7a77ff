"""Weight versions: checking a new checkpoint before it touches the engine, and fencing updates.

A rollout must come from one set of weights (its ``policy_version`` covers every token), so the
engine's weights change only when no rollout is running: an update waits for running rollouts to
finish (``FINISH``) or asks them to stop at their next turn and aborts their engine requests
(``ABORT``), and new rollouts wait until the update is done. They wait too while a newer version is readied
(``holding``: its checkpoint waited for, its digest read): none starts on weights about to be superseded.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from ragr1.services.common.errors import FailedPrecondition, InvalidArgument, Unavailable

# Config fields that fix the architecture: a checkpoint differing in any is not the served model.
ARCHITECTURE_FIELDS = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "tie_word_embeddings",
)


class InFlight(enum.Enum):
    """What happens to running rollouts when new weights arrive (values match ``ragr1.v1.InFlightPolicy``)."""

    FINISH = 1
    ABORT = 2


def _tensor_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor in the directory's safetensors files (headers only)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def _config(directory: Path) -> dict[str, Any]:
    return dict(json.loads((directory / "config.json").read_text()))


def check_checkpoint(served: Path, checkpoint_path: str) -> Path:
    """The checkpoint's directory; raises, naming the reason, unless it holds the served model's weights."""
    if not checkpoint_path.strip():
        raise InvalidArgument("checkpoint_path is empty")
    candidate = Path(checkpoint_path)
    try:
        is_dir = candidate.is_dir()
    except OSError as exc:  # a name too long, a permission denied: the caller's path, not our failure
        raise InvalidArgument(f"checkpoint_path {checkpoint_path[:200]!r} cannot be read: {exc.strerror}") from exc
    if not is_dir:
        raise FailedPrecondition(f"checkpoint {candidate} does not exist or is not a directory")
    if not (candidate / "config.json").is_file():
        raise FailedPrecondition(f"checkpoint {candidate} has no config.json")
    if not any(candidate.glob("*.safetensors")):
        raise FailedPrecondition(f"checkpoint {candidate} has no *.safetensors files")
    try:
        mine, theirs = _config(served), _config(candidate)
    except json.JSONDecodeError as exc:
        raise FailedPrecondition(f"checkpoint {candidate}: config.json is not JSON: {exc}") from exc
    for field in ARCHITECTURE_FIELDS:
        if mine.get(field) != theirs.get(field):
            raise FailedPrecondition(
                f"checkpoint {candidate} does not match the served model: {field} is "
                f"{theirs.get(field)!r}, served {mine.get(field)!r}"
            )
    try:
        expected, got = _tensor_shapes(served), _tensor_shapes(candidate)
    except Exception as exc:
        raise FailedPrecondition(f"checkpoint {candidate}: unreadable safetensors: {exc}") from exc
    missing = sorted(set(expected) - set(got))
    if missing:
        raise FailedPrecondition(
            f"checkpoint {candidate} lacks {len(missing)} tensors of the served model, e.g. {missing[:3]}"
        )
    wrong = [n for n in expected if got[n] != expected[n]]
    if wrong:
        name = wrong[0]
        raise FailedPrecondition(
            f"checkpoint {candidate}: tensor {name} has shape {list(got[name])}, "
            f"served {list(expected[name])}"
        )
    return candidate


class VersionGate:
    """The served weight version, and the fence between rollouts and weight updates (one event loop)."""

    def __init__(self, version: int = 0, checkpoint_path: str = "") -> None:
        self.version = version
        self.checkpoint_path = checkpoint_path
        # Why the engine's weights are unknown ("" while they are known): a load that failed part-way may have
        # replaced some tensors and not others, so nothing runs on them until a load succeeds.
        self.failed = ""
        self.abort_requested = False
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._updates = asyncio.Lock()
        self._holds = 0

    @property
    def running(self) -> int:
        return self._running

    @property
    def closed(self) -> bool:
        """Whether a rollout starting now waits (an update or a newer version being readied holds the gate)."""
        return not self._open.is_set()

    @contextlib.asynccontextmanager
    async def rollout(self) -> AsyncIterator[int]:
        """Holds the current weights for one rollout or generation; yields their version. Raises ``Unavailable``
        while the weights are unknown after a failed load."""
        while not self._open.is_set():
            await self._open.wait()
        if self.failed:
            raise Unavailable(f"the engine's weights are unknown after a failed load ({self.failed}); "
                              "nothing runs on them until a load succeeds")
        self._running += 1
        self._idle.clear()
        try:
            yield self.version
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def holding(self) -> AsyncIterator[None]:
        """New rollouts wait while this is held (a newer version being readied and loaded: its checkpoint waited
        for, its digest read), so that none starts on weights about to be superseded; running ones go on, and
        the update decides their fate. Held by nobody and with no update running, the gate opens again (on the
        old weights when the new ones were refused)."""
        self._holds += 1
        self._open.clear()
        try:
            yield
        finally:
            self._holds -= 1
            if not self._holds and not self._updates.locked():
                self._open.set()

    async def update(
        self,
        version: int,
        checkpoint_path: str,
        load: Callable[[], Awaitable[None]],
        *,
        in_flight: InFlight,
        abort: Callable[[], Awaitable[None]],
        same_version: bool = False,
    ) -> None:
        """Runs ``load`` with no rollout running, then serves ``version``. A load that raises leaves the weights
        unknown (``failed``) until one succeeds. ``same_version``: ``version`` may equal the served one (other
        weights announced under it: the trainer's starting weights are version 0, as a replica's own model is);
        after a failed load it always may."""
        async with self._updates:
            if version < self.version or (version == self.version and not (same_version or self.failed)):
                raise InvalidArgument(
                    f"version must be greater than the current {self.version}, got {version}"
                )
            self._open.clear()
            try:
                if in_flight is InFlight.ABORT and self._running:
                    self.abort_requested = True
                    await abort()
                await self._idle.wait()
                try:
                    await load()
                except BaseException as exc:
                    self.failed = f"v{version} from {checkpoint_path}: {type(exc).__name__}: {exc}"
                    raise
                self.version, self.checkpoint_path, self.failed = version, checkpoint_path, ""
            finally:
                self.abort_requested = False
                if not self._holds:
                    self._open.set()

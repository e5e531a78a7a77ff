"""A shard whose index file was changed after the build (same size, other bytes) starts serving at once,
then stops itself with exit code 1 when the background checksum finds the mismatch: the container
restarts instead of answering from a corrupted index."""

from __future__ import annotations

import shutil
from pathlib import Path

from ragr1.services.common.process import ServiceProcess
from ragr1.services.retriever.manifest import LoadedManifest


def test_a_corrupted_shard_serves_then_stops_with_exit_1_naming_the_file(
    index_dirs: dict[int, Path], tmp_path: Path, processes: list[ServiceProcess]
) -> None:
    index = shutil.copytree(index_dirs[1], tmp_path / "index")
    shard_file = LoadedManifest(index).shard_path(0)  # type: ignore[arg-type]
    data = bytearray(shard_file.read_bytes())
    data[-5] ^= 0xFF  # a vector's byte: the size check at start passes, the checksum does not
    shard_file.write_bytes(bytes(data))
    shard = ServiceProcess.ragr1(
        "shard", ["serve", "retriever-shard", "--index", str(index), "--port", "0", "--metrics-port", "0"],
        None, tmp_path / "shard.log",
    ).launch()
    processes.append(shard)
    assert shard.process is not None
    assert shard.process.wait(timeout=120) == 1
    log = shard.log_tail(20000)
    stopped = log.find("retriever-shard-0: the checksum check stopped the server: ManifestMismatch")
    assert 0 < log.find("READY retriever-shard-0") < stopped, log  # it served before the file was read whole
    assert f"{shard_file} has sha256" in log

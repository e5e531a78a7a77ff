"""Every ``ragr1`` command family, given bad input (a wrong checkpoint folder, an unreachable endpoint, a
malformed file, a bad flag value) or an error answered by a real service, ends with one line on stderr
naming the problem and a non-zero exit, never a traceback. Each runs the real command as a user would, in a
process of its own, on input refused before anything heavy (an engine, a model) starts."""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ragr1.cli import TRACEBACK_ENV, explain, main
from ragr1.model_paths import find_model
from ragr1.services.common.redis_server import free_port
from tests.common.status_process import start_server

ROOT = Path(__file__).resolve().parent.parent


def ragr1(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RAGR1_")}
    environment["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "ragr1", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**environment, **(env or {})})


def one_line_error(result: subprocess.CompletedProcess[str], command: str, *naming: str, code: int = 2) -> str:
    """The one line the command printed on stderr; it says which command failed and names the problem."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith(f"{command}: error: "), line
    for text in naming:
        assert text in line, line
    assert result.returncode == code, (result.returncode, line)
    return line


def model_dir(path: Path) -> Path:
    """A folder that looks like a Hugging Face checkpoint (config.json and weights)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_serve_refuses_a_bad_setting_and_a_missing_index(tmp_path: Path) -> None:
    one_line_error(ragr1("serve", "reward", "--max-items", "0", cwd=tmp_path), "ragr1 serve reward",
                   "max_items must be at least 1, got 0")
    one_line_error(ragr1("serve", "retriever-shard", "--index", str(tmp_path / "none"), cwd=tmp_path),
                   "ragr1 serve retriever-shard", str(tmp_path / "none"), "ragr1 index build")


def test_serve_names_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line_error(ragr1("serve", "reward", "--port", str(port), cwd=tmp_path), "ragr1 serve reward",
                       f"gRPC port 127.0.0.1:{port} is already in use", code=1)
        one_line_error(ragr1("serve", "reward", "--port", "0", "--metrics-port", str(port), cwd=tmp_path),
                       "ragr1 serve reward", f"metrics port 127.0.0.1:{port}", "--metrics-port", code=1)


def test_serve_policy_refuses_a_folder_without_a_model_before_loading_vllm(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(ragr1("serve", "policy", "--model", str(empty), cwd=tmp_path),
                   "ragr1 serve policy", f"model {empty}: no config.json")


def test_train_refuses_a_folder_of_several_checkpoints_naming_them(tmp_path: Path) -> None:
    """The trainer's checkpoints folder holds one model per version: which one is the user's to say."""
    checkpoints = tmp_path / "trainer" / "checkpoints"
    for version in ("v000005", "v000006"):
        model_dir(checkpoints / version / "policy")
    for stage in ("sft", "ppo"):
        one_line_error(ragr1("train", stage, "--model", str(checkpoints), cwd=tmp_path), f"ragr1 train {stage}",
                       f"model {checkpoints} holds 2 models", "v000005/policy", "v000006/policy")


def test_eval_refuses_a_checkpoint_folder_without_a_model_before_calling_the_policy(tmp_path: Path) -> None:
    """A trainer checkpoint version whose policy/ is gone: the user hears which folder and what was looked
    for, not the policy's refusal (no policy runs at this address: the check comes first)."""
    version = tmp_path / "v000006"
    (version / "policy").mkdir(parents=True)
    (version / "meta.json").write_text("{}")
    line = one_line_error(
        ragr1("eval", "--benchmarks", "nq", "--limit", "1", "--checkpoint", str(version),
              "--policy", f"127.0.0.1:{free_port()}", cwd=tmp_path),
        "ragr1 eval", f"checkpoint {version}: no config.json", "policy/")
    assert "UNAVAILABLE" not in line


def test_eval_names_an_unreachable_policy(tmp_path: Path) -> None:
    port = free_port()
    one_line_error(ragr1("eval", "--benchmarks", "nq", "--limit", "1", "--policy", f"127.0.0.1:{port}",
                         cwd=tmp_path),
                   "ragr1 eval", "ragr1.v1.Policy/Info", "UNAVAILABLE", f"127.0.0.1:{port}", code=1)


def test_eval_reports_the_error_a_real_service_answers(tmp_path: Path) -> None:
    """A real gRPC server built on the services' runtime that is not a policy: it answers UNIMPLEMENTED."""
    port = free_port()
    with start_server(tmp_path, port):
        one_line_error(ragr1("eval", "--benchmarks", "nq", "--limit", "1", "--policy", f"127.0.0.1:{port}",
                             cwd=tmp_path),
                       "ragr1 eval", "ragr1.v1.Policy/Info", "UNIMPLEMENTED", code=1)


def test_eval_refuses_malformed_files(tmp_path: Path) -> None:
    bad = tmp_path / "questions.jsonl"
    bad.write_text('{"question": "Who?", "golden_answers": ["x"]}\n{"question": "Why?"\n')
    one_line_error(ragr1("eval", "--file", str(bad), cwd=tmp_path), "ragr1 eval", f"{bad}:2", "not valid JSON")
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text('{"services": {}}')
    one_line_error(ragr1("eval", "--benchmarks", "nq", "--endpoints", str(endpoints), cwd=tmp_path), "ragr1 eval",
                   f"endpoints {endpoints}", "services.policy.grpc")


def test_data_prepare_refuses_a_malformed_file(tmp_path: Path) -> None:
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"id": "1", "contents": "a passage, not a question"}\n')
    one_line_error(ragr1("data", "prepare", "--train-files", str(bad), "--out", str(tmp_path / "out"), cwd=tmp_path),
                   "ragr1 data prepare", f"{bad}:1", "question")


def test_corpus_and_index_refuse_malformed_input(tmp_path: Path) -> None:
    bad = tmp_path / "corpus.jsonl"
    bad.write_text('{"id": "1", "contents": "A\\nfine passage"}\n{"id": "2", "contents": \n')
    one_line_error(ragr1("corpus", "ingest", "--input", str(bad), "--out", str(tmp_path / "store"), cwd=tmp_path),
                   "ragr1 corpus ingest", f"{bad}:2", "not valid JSON")
    one_line_error(ragr1("index", "build", "--store", str(tmp_path / "nowhere"), "--out", str(tmp_path / "i"),
                         cwd=tmp_path),
                   "ragr1 index build", str(tmp_path / "nowhere"), "not a passage store")
    one_line_error(ragr1("index", "plan", "--shard-counts", "1,two", cwd=tmp_path), "ragr1 index plan",
                   "'shard_counts'", "two")


def test_demo_and_up_refuse_bad_input_before_starting_anything(tmp_path: Path) -> None:
    empty, run = tmp_path / "sft", tmp_path / "run"
    empty.mkdir()
    one_line_error(ragr1("demo", "--sft-checkpoint", str(empty), "--run-dir", str(run), cwd=tmp_path),
                   "ragr1 demo", f"sft_checkpoint {empty}: no config.json")
    one_line_error(ragr1("demo", "--preset", "tiny", "--run-dir", str(run), cwd=tmp_path), "ragr1 demo", "tiny")
    one_line_error(ragr1("up", "--num-shards", "0", "--run-dir", str(run), cwd=tmp_path), "ragr1 up",
                   "num_shards must be at least 1")
    assert not run.exists()


def test_redis_refuses_a_missing_password_file(tmp_path: Path) -> None:
    one_line_error(ragr1("redis", "--password-file", str(tmp_path / "pw"), "--port", "0", cwd=tmp_path),
                   "ragr1 redis", f"password_file {tmp_path / 'pw'}")


def test_an_unknown_flag_is_one_line_not_the_usage(tmp_path: Path) -> None:
    result = ragr1("serve", "reward", "--max-itemz", "3", cwd=tmp_path)
    (line,) = result.stderr.splitlines()
    assert line == "ragr1 serve reward: error: unrecognized arguments: --max-itemz 3 (--help for usage)"
    assert result.returncode == 2


def test_a_flag_is_never_taken_for_another_it_begins(tmp_path: Path) -> None:
    """``--num-shard`` is not ``--num-shards``: a misspelt flag is refused instead of setting a neighbour."""
    result = ragr1("up", "--num-shard", "0", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    (line,) = result.stderr.splitlines()
    assert "unrecognized arguments: --num-shard 0" in line
    assert result.returncode == 2


def test_ragr1_traceback_lets_the_exception_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(ValueError, match="num_shards must be at least 1, got 0"):
        main(["up", "--num-shards", "0"])


def test_the_command_line_parses_without_importing_torch_or_vllm(tmp_path: Path) -> None:
    """What keeps a refusal (and ``ragr1 --help``) quick: the heavy libraries load only when a command needs
    them."""
    code = "import sys, ragr1.cli; ragr1.cli.build_parser(); print([m for m in ('torch', 'transformers', 'vllm') " \
           "if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_an_unexpected_error_says_how_to_see_its_traceback() -> None:
    code, message = explain(KeyError("services"))
    assert (code, message) == (1, f"KeyError: 'services' ({TRACEBACK_ENV}=1 for the traceback)")


def test_a_checkpoint_folder_is_taken_wherever_its_one_model_lies(tmp_path: Path) -> None:
    """A trainer checkpoint version (the model in its policy/), a run folder holding one model, or the model
    folder itself; an index's encoder export (config.json, no safetensors) is not a model."""
    policy = model_dir(tmp_path / "run" / "trainer" / "checkpoints" / "v000006" / "policy")
    (tmp_path / "run" / "index" / "encoder").mkdir(parents=True)
    (tmp_path / "run" / "index" / "encoder" / "config.json").write_text("{}")
    for given in (policy, policy.parent, tmp_path / "run"):
        assert find_model(given) == policy.resolve()
    with pytest.raises(FileNotFoundError, match="is a file; give the folder that holds it"):
        find_model(policy / "config.json")
    with pytest.raises(FileNotFoundError, match="no such directory"):
        find_model(tmp_path / "missing")


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``ragr1 args`` run here (no process start: these refusals come before anything heavy): the exit
    code and the one line on stderr."""
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return code, lines[0]


def test_a_config_file_with_a_syntax_error_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "reward.yaml"
    bad.write_text("max_items: [1, 2\nport: 3\n")
    code, line = in_process(capsys, "serve", "reward", "--config", str(bad))
    assert code == 2 and line.startswith(f"ragr1 serve reward: error: config file {bad}: not valid YAML: "), line
    bad_json = tmp_path / "reward.json"
    bad_json.write_text('{"max_items": }')
    code, line = in_process(capsys, "serve", "reward", "--config", str(bad_json))
    assert code == 2 and f"config file {bad_json}: not valid JSON: " in line, line


def test_a_bad_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RAGR1_PORT", "abc")
    code, line = in_process(capsys, "serve", "reward")
    assert code == 2 and "config field 'port'" in line and "(from RAGR1_PORT)" in line, line


@pytest.mark.parametrize(("flag", "value", "low"), [("--port", "99999", 0), ("--port", "-2", 0),
                                                     ("--metrics-port", "70000", -1)])
def test_a_port_out_of_range_is_refused_by_name(capsys: pytest.CaptureFixture[str], flag: str, value: str,
                                                low: int) -> None:
    code, line = in_process(capsys, "serve", "reward", flag, value)
    name = flag.removeprefix("--").replace("-", "_")
    assert (code, line) == (2, f"ragr1 serve reward: error: {name} must be within [{low}, 65535], got {value}")


def test_version_needs_no_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"ragr1 {importlib.metadata.version('ragr1')}"


def test_a_missing_module_names_its_extra() -> None:
    code, message = explain(ModuleNotFoundError("No module named 'vllm'", name="vllm"))
    assert (code, message) == (1, "this command needs the 'policy' extra, which is not installed (no module 'vllm'): "
                                  "pip install 'ragr1[policy]'")
    # A module of this package missing is a bug, not an install to complete.
    code, message = explain(ModuleNotFoundError("No module named 'ragr1.gone'", name="ragr1.gone"))
    assert code == 1 and message.startswith("ModuleNotFoundError: ") and "extra" not in message

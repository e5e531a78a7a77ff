"""The GPU check: the trainer, FSDP2, the rollout loop and the retriever's exact search on a CUDA GPU, in one
command that ends within a time limit and leaves one table (docs/gpu-check.md).

    scripts/gpu-check.sh [--device cuda|cpu] [--tiny] [--out PATH] [--time-limit SECONDS]
                         [--sections trainer,fsdp,rollout,retriever]

This process only drives: the measurements (``bench/gpu/sections.py``) run in a child process, section by
section, each within its time budget. A section that overruns its budget, or a child that hangs or dies (a
CUDA error that poisons the process, a crash in a native library), is recorded as FAILED with a one-line
reason, and a new child goes on with the remaining sections. The JSON report (``--out``; ``$OUT/gpu-check.json``
when ``$OUT`` is set) is rewritten after every measurement, so a run cut short keeps what it measured; a
Markdown copy of the table and the child's log go beside it. The table and the environment are printed at
the end. The exit status is 0 when nothing FAILED.

``--device cpu --tiny`` runs the same code at toy sizes on the CPU: ``make test`` runs it
(tests/bench/test_gpu_check.py) so that the check keeps working between the rare tasks lent a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("trainer", "fsdp", "rollout", "retriever")
# Seconds per section at the GPU sizes, and at --tiny on 2 busy shared cores. The whole check stays within
# TIME_LIMIT, so that a lent GPU's 15 minutes hold its start, one run and a rerun.
BUDGETS = {"trainer": 190, "fsdp": 45, "rollout": 110, "retriever": 110}
TINY_BUDGETS = {"trainer": 150, "fsdp": 60, "rollout": 60, "retriever": 60}
TIME_LIMIT = 450
# From a child's start to its first report (importing torch and reading the device), and between sections.
STARTUP_SECONDS = 90
POLL_SECONDS = 0.2
COLUMNS = (
    "section", "case", "status", "throughput", "s/step", "peak GPU GiB", "held GiB", "vs", "MFU", "ops/token", "notes"
)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class Report:
    """The rows and the environment, rewritten to ``path`` (JSON) and beside it (Markdown) on every change."""

    def __init__(self, path: Path, args: argparse.Namespace) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "started": now(),
            "finished": None,
            "device": args.device,
            "tiny": args.tiny,
            "time_limit_s": args.time_limit,
            "command": sys.argv,
            "environment": {},
            "carried_wheels": carried_wheels(),
            "sections": {name: {"status": "pending", "budget_s": args.budgets[name]} for name in args.sections},
            "rows": [],
            "child_modules": [],
        }
        self.save()

    @property
    def rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.data["rows"]
        return rows

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        tmp.replace(self.path)
        self.path.with_suffix(".md").write_text(self.markdown() + "\n")

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.save()
        print(f"  {row['status']:<7} {row['case']}: {describe(row)}", flush=True)

    def section(self, name: str, status: str, **fields: Any) -> None:
        self.data["sections"][name].update(status=status, **fields)
        self.save()

    def fail_section(self, name: str, reason: str) -> None:
        self.add({"section": name, "case": "(the section)", "status": "FAILED", "reason": reason})
        self.section(name, "FAILED", reason=reason)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for row in self.rows:
            cells = [row["section"], row["case"], row["status"], *cells_of(row)]
            lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
        return "\n".join(lines)

    def environment_text(self) -> str:
        env = self.data["environment"]
        if not env:
            return "environment: not reported (the check's process never started)"
        gpu = (
            f"{env['gpu']} ({env['gpu_memory_gib']} GiB, compute capability {env['capability']}, "
            f"{env['multiprocessors']} SMs), NCCL {env['nccl']}"
            if "gpu" in env
            else "no GPU used" + (f" ({env['error']})" if "error" in env else "")
        )
        packages = ", ".join(
            f"{k} {env[k]}" for k in ("transformers", "peft", "faiss-cpu", "faiss-gpu-cu12", "grpcio", "protobuf")
            if k in env
        )
        wheels = self.data["carried_wheels"]
        carried = (
            f"{len(wheels)} carried wheels, {sum(w['bytes'] for w in wheels) / 2**20:.1f} MiB"
            if wheels
            else "no carried wheels"
        )
        return (
            f"environment: {gpu}; torch {env['torch']}, CUDA {env['cuda']}; Python {env['python']}; {packages}; "
            f"{env['cpus']} CPUs, {env['memory_gib']} GiB; {carried}"
        )


def carried_wheels() -> list[dict[str, Any]]:
    folder = ROOT / ".whl"
    return [{"file": p.name, "bytes": p.stat().st_size} for p in sorted(folder.glob("*.whl"))]


def number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def cells_of(row: dict[str, Any]) -> list[str]:
    """throughput, s/step, peak GiB, held GiB, vs, MFU (blank where the card's peak is unknown), operators per
    token (where counted), notes."""
    if row["status"] != "ok":
        return ["", "", "", "", "", "", "", row.get("reason", "")]

    def gib(key: str) -> str:
        return "" if row.get(key) is None else f"{row[key]:.1f}"

    vs = f"{row['vs']:.2f}x {row['vs_what']}" if row.get("vs") is not None else ""
    utilisation = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else ""
    ops = f"{row['ops_per_token']:.1f}" if row.get("ops_per_token") is not None else ""
    return [f"{number(row['rate'])} {row['unit']}", f"{row['seconds']:.3g}", gib("peak_gib"), gib("state_gib"), vs,
            utilisation, ops, row.get("note", "")]


def describe(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return row.get("reason", "")
    throughput, seconds, peak, _held, vs, utilisation, ops, _note = cells_of(row)
    parts = [throughput, f"{seconds} s a step"]
    if peak:
        parts.append(f"peak {peak} GiB")
    if vs:
        parts.append(vs)
    if utilisation:
        parts.append(f"MFU {utilisation}")
    if ops:
        parts.append(f"{ops} operators a token")
    return ", ".join(parts)


def read_events(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The complete lines written since ``offset``."""
    if not path.exists():
        return [], offset
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], offset + end


def last_log_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def run_child(args: argparse.Namespace, sections: list[str], until: float, report: Report, log: Path) -> None:
    """One child process for ``sections``, followed until it ends or is killed; records what it reports."""
    events = report.path.with_suffix(f".events-{os.getpid()}-{time.time_ns()}")
    budgets = ",".join(f"{name}={args.budgets[name]}" for name in sections)
    command = [
        sys.executable, str(ROOT / "bench" / "gpu" / "sections.py"), "--events", str(events), "--device", args.device,
        "--sections", ",".join(sections), "--budgets", budgets, "--until", str(until),
    ] + (["--tiny"] if args.tiny else [])
    with log.open("a") as out:
        out.write(f"\n=== {now()} {' '.join(command)}\n")
        out.flush()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    offset, current, started, began_any = 0, None, 0.0, False
    deadline = min(time.time() + STARTUP_SECONDS, until)
    try:
        while True:
            code = child.poll()
            new, offset = read_events(events, offset)
            for event in new:
                kind = event["event"]
                if kind == "environment":
                    report.data["environment"] = event["environment"]
                    report.save()
                elif kind == "start":
                    current, started, began_any = event["section"], time.time(), True
                    deadline = min(started + args.budgets[current], until)
                    report.section(current, "running")
                    print(f"[{current}] budget {deadline - started:.0f} s", flush=True)
                elif kind == "row":
                    report.add(event["row"])
                elif kind == "end":
                    failed = any(r["status"] == "FAILED" for r in report.rows if r["section"] == current)
                    report.section(event["section"], "FAILED" if failed else "ok", seconds=round(time.time() - started))
                    current, deadline = None, min(time.time() + STARTUP_SECONDS, until)
                elif kind == "modules":
                    report.data["child_modules"] = event["modules"]
                    report.save()
            if code is not None:
                if current is not None:
                    report.fail_section(current, f"the check's process {exit_reason(code)}: {last_log_line(log)}")
                elif not began_any:
                    # It ended before its first section: the next child would too.
                    for name in sections:
                        report.fail_section(name, f"the check's process {exit_reason(code)}: {last_log_line(log)}")
                return
            if time.time() > deadline:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                if current is None:
                    current = next(s for s in sections if report.data["sections"][s]["status"] == "pending")
                    reason = f"the check's process did not start the section within {STARTUP_SECONDS} s"
                else:
                    reason = f"timed out after {time.time() - started:.0f} s (its budget: {args.budgets[current]} s)"
                report.fail_section(current, reason)
                return
            time.sleep(POLL_SECONDS)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        events.unlink(missing_ok=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where to measure (default cuda)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (the CPU test in make test)")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="the JSON report (default: $OUT/gpu-check.json when $OUT is set, else runs/gpu-check.json)",
    )
    parser.add_argument(
        "--time-limit", type=float, default=TIME_LIMIT,
        help=f"seconds for the whole check (default {TIME_LIMIT}); sections not started by then are SKIPPED",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument(
        "--budget", action="append", default=[], metavar="SECTION=SECONDS",
        help="a section's time budget instead of its default (repeatable)",
    )
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown or not args.sections:
        parser.error(
            f"--sections: unknown section(s) {', '.join(unknown) or '(none given)'}; use {', '.join(SECTIONS)}"
        )
    if args.time_limit <= 0:
        parser.error(f"--time-limit must be positive, got {args.time_limit}")
    if args.out is None:
        out = os.environ.get("OUT")
        args.out = Path(out) / "gpu-check.json" if out else ROOT / "runs" / "gpu-check.json"
    args.budgets = dict(TINY_BUDGETS if args.tiny else BUDGETS)
    for item in args.budget:
        name, _, seconds = item.partition("=")
        try:
            value = float(seconds)
        except ValueError:
            value = 0.0
        if name not in SECTIONS or value <= 0:
            parser.error(f"--budget {item!r}: expected SECTION=SECONDS with a section of {', '.join(SECTIONS)}")
        args.budgets[name] = value
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    start = time.time()
    until = start + args.time_limit
    report = Report(args.out, args)
    log = args.out.with_suffix(".log")
    log.write_text("")
    print(f"GPU check on {args.device}{' (tiny sizes)' if args.tiny else ''}; report {args.out}, log {log}", flush=True)
    while True:
        pending = [s for s in args.sections if report.data["sections"][s]["status"] == "pending"]
        if not pending:
            break
        if time.time() >= until - 1:
            for name in pending:
                report.add({"section": name, "case": "(the section)", "status": "SKIPPED",
                            "reason": f"the check's time limit ({args.time_limit:.0f} s) was spent"})
                report.section(name, "SKIPPED")
            break
        run_child(args, pending, until, report, log)
    report.data["finished"] = now()
    report.data["seconds"] = round(time.time() - start)
    report.save()
    print()
    print(report.environment_text())
    print(f"GPU check, {report.data['finished']}, {report.data['seconds']} s ({args.out}):")
    print(report.markdown(), flush=True)
    return 1 if any(r["status"] == "FAILED" for r in report.rows) else 0


if __name__ == "__main__":
    sys.exit(main())

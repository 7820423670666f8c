"""The pytest plugin of ``scripts/gpu_checks.sh``: per-test JSON records, and skips for what the GPU image lacks.

Loaded only by that script (``-p tests.gpu.gpu_report --gpu-report FILE``); the normal suite never sees its hooks.

- Records: one per test (``test``, ``outcome``, ``seconds``, ``failure`` / ``skip_reason``) plus the figures the
  test put into its ``gpu_record`` fixture (``peak_before_mib``, ``during_mib``, ``peak_after_mib``,
  ``alloc_*_mib``, ...), written as JSON at the end of the session with the machine's description.
- The GPU image has no vLLM and no Ray, and may lack DeepSpeed or the test extras: a test module whose import fails
  on a module that is not installed is skipped (listed as not collected), and a test that needs vLLM, Ray or
  DeepSpeed (the ``ray_runtime`` / ``vllm_replicas`` fixtures; "deepspeed" in its name) is skipped with the reason,
  instead of erroring.

``python -m tests.gpu.gpu_report summarize FILE [--allow-no-cuda]`` prints the records as a Markdown table and
exits 0 when every check that ran passed on a CUDA device, 1 when one failed (or errored, or the session was
interrupted, or nothing ran), 2 when there was no CUDA device (everything skipped; 0 with ``--allow-no-cuda``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

RECORD_KEY = "gpu_check"
EXIT_OK, EXIT_FAILED, EXIT_NO_CUDA = 0, 1, 2
OPTIONAL_MODULES = ("vllm", "ray", "deepspeed")
RAY_FIXTURES = {"ray_runtime", "vllm_replicas"}  # tests/conftest.py: a private Ray with vLLM replicas

_records: dict[str, dict[str, Any]] = {}
_ignored: list[str] = []


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--gpu-report", default=None, help="gpu_report: write the per-test JSON records to this file")


MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


def _missing_import(text: str) -> str | None:
    """The top-level module a ``ModuleNotFoundError`` in ``text`` names, if it is not installed here."""
    match = MISSING_MODULE.search(text)
    top = match.group(1).split(".")[0] if match else None
    return top if top and _missing(top) else None


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """A test module that imports what this machine lacks (vLLM, Ray, hypothesis, ...) is skipped, not an error."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and isinstance(collector, pytest.Module):
        module = _missing_import(str(report.longrepr))
        if module is not None:
            report.outcome = "skipped"
            report.longrepr = (str(collector.path), 0, f"Skipped: needs {module}: not installed on this machine")
            _ignored.append(f"{collector.path.name} (imports {module}, not installed)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = {m for m in OPTIONAL_MODULES if _missing(m)}
    for item in items:
        needs = []
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            needs += [m for m in ("ray", "vllm") if m in missing]
        if "deepspeed" in item.name.lower() and "deepspeed" in missing:
            needs.append("deepspeed")
        if needs:
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(needs)}: not installed on this machine"))


def _message(report: Any) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = getattr(crash, "message", None) or str(getattr(report, "longrepr", "") or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:200] if lines else ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    rec = _records.setdefault(report.nodeid, {"test": report.nodeid, "outcome": "passed", "seconds": 0.0})
    rec["seconds"] = round(rec["seconds"] + report.duration, 3)
    for name, value in report.user_properties:
        if name == RECORD_KEY and isinstance(value, dict):
            rec.update({k: v for k, v in value.items() if k not in ("test", "outcome", "seconds")})
    if report.failed:
        rec["outcome"] = "failed" if report.when == "call" else "error"
        rec.setdefault("failure", f"{report.when}: {_message(report)}")
    elif report.skipped and rec["outcome"] == "passed":
        if hasattr(report, "wasxfail"):
            rec["outcome"] = "xfailed"
        else:
            rec["outcome"] = "skipped"
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else _message(report)
            rec["skip_reason"] = str(reason).removeprefix("Skipped: ")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _records[report.nodeid] = {
            "test": report.nodeid,
            "outcome": "error",
            "seconds": 0.0,
            "failure": f"collection: {_message(report)}",
        }


def _environment() -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    try:
        device = torch.cuda.get_device_name(0) if cuda else None
    except Exception as err:  # the report must be written whatever the driver says
        device = f"unknown ({type(err).__name__}: {err})"
    return {
        "cuda": cuda,
        "device": device,
        "device_count": torch.cuda.device_count() if cuda else 0,
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "installed": {m: not _missing(m) for m in OPTIONAL_MODULES},
    }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = session.config.getoption("--gpu-report")
    if not path:
        return
    out = {
        **_environment(),
        "exitstatus": int(exitstatus),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "ignored_files": list(_ignored),
        "tests": list(_records.values()),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1, default=str))


# ------------------------------------------------------------------------------------------------ the summary
COLUMNS = (
    ("check", None),
    ("result", None),
    ("s", None),
    ("peak before MiB", "peak_before_mib"),
    ("during MiB", "during_mib"),
    ("peak after MiB", "peak_after_mib"),
    ("allocated before → offloaded → onloaded MiB", None),
    ("note", None),
)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "–"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _short(nodeid: str) -> str:
    return nodeid.removeprefix("tests/").replace(".py::", "::")


def table(report: dict[str, Any]) -> str:
    """The records of ``report`` (the plugin's JSON) as a Markdown table, one row per check."""
    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for rec in report["tests"]:
        resident = [rec.get(k) for k in ("alloc_before_mib", "alloc_offloaded_mib", "alloc_onloaded_mib")]
        resident_cell = " → ".join(str(v) for v in resident) if all(v is not None for v in resident) else None
        if resident_cell is None and rec.get("ipc_mib") is not None:
            resident_cell = f"IPC {rec['ipc_mib']} MiB in {rec.get('ipc_s', '?')} s"
        cells = [_short(rec["test"]), rec["outcome"], f"{rec.get('seconds', 0.0):.1f}"]
        cells += [rec.get(key) for _, key in COLUMNS[3:6]]
        note = "; ".join(str(rec[k]) for k in ("failure", "skip_reason", "note") if rec.get(k))
        cells += [resident_cell, note]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def summarize(path: Path, allow_no_cuda: bool = False) -> int:
    """Print the table and the verdict of the JSON at ``path``; return the exit code (module docstring)."""
    if not path.exists():
        print(f"gpu checks: no report at {path} (pytest did not finish)")
        return EXIT_FAILED
    report = json.loads(path.read_text())
    tests = report["tests"]
    counts: dict[str, int] = {}
    for rec in tests:
        counts[rec["outcome"]] = counts.get(rec["outcome"], 0) + 1
    installed = ", ".join(f"{m} {'yes' if ok else 'no'}" for m, ok in report["installed"].items())
    device = report["device"] or "no CUDA device"
    print(f"device: {device} (x{report['device_count']}); torch {report['torch']}, CUDA {report['cuda_version']}")
    print(f"installed: {installed}; finished {report['finished']}; pytest exit status {report['exitstatus']}")
    for ignored in report["ignored_files"]:
        print(f"not collected: {ignored}")
    print()
    print(table(report))
    print()
    print("checks: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) if counts else "no checks")
    bad = counts.get("failed", 0) + counts.get("error", 0)
    if bad or report["exitstatus"] not in (0, 5):
        print(f"gpu checks FAILED: {bad} failed or errored, pytest exit status {report['exitstatus']}")
        return EXIT_FAILED
    if not report["cuda"]:
        print(f"no CUDA device: {counts.get('skipped', 0)} checks skipped")
        return EXIT_OK if allow_no_cuda else EXIT_NO_CUDA
    if not counts.get("passed"):
        print("gpu checks FAILED: a CUDA device is present but no check ran")
        return EXIT_FAILED
    print(f"gpu checks passed on {device}: {counts['passed']} passed, {counts.get('skipped', 0)} skipped")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.gpu_report", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("summarize", help="print the Markdown table of a report and exit with its verdict")
    p.add_argument("report", type=Path)
    p.add_argument("--allow-no-cuda", action="store_true", help="exit 0, not 2, when there was no CUDA device")
    args = parser.parse_args(argv)
    return summarize(args.report, args.allow_no_cuda)


if __name__ == "__main__":
    sys.exit(main())

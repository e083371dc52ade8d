"""The `migpart` command line: `--version`, one-line errors with exit 2 (a bad flag value, a
missing or broken kubeconfig), defaults in every `--help`, and what cannot run outside a
checkout saying so.

The kubeconfig cases run the real `migpart operator` / `migpart agent` processes: each must
fail before it starts anything, with one line on stderr and no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

import migpart
from migpart import cli
from migpart.commands import agent, demo, operator, plan, simulate, testbed

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "openb_pod_list_default.csv"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`migpart ARGV` in this process: (exit status, stdout, stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def run_process(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "migpart.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    code, out, _ = run(["--version"], capsys)
    assert code == 0
    assert out == f"migpart {project['version']}\n"


def test_version_names_the_image_revision(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(migpart.REVISION_ENV, "0123abc")
    code, out, _ = run(["--version"], capsys)
    assert code == 0
    assert out.strip().endswith("(revision 0123abc)")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["operator", "--metrics-port", "http"], "--metrics-port: 'http' is not a port number"),
        (["operator", "--tick-seconds", "soon"], "--tick-seconds: 'soon' is not a number"),
        (["operator", "--withdraw-grace-seconds", "-1"], "expected a number of seconds >= 0"),
        (["operator", "--log-level", "loud"], "--log-level: 'loud' is not one of DEBUG"),
        (["operator", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["agent", "--metrics-port", "70000"], "'70000' is not a port number"),
        (["agent", "--sim-faults", "timeout=2"], "--sim-faults"),
        (["agent", "--sim-latency-ms", "x"], "--sim-latency-ms: invalid float value: 'x'"),
        (["agent", "--log-level", "verbose"], "'verbose' is not one of DEBUG"),
        (["agent", "--stop-grace-seconds", "0", "--node-name", "n"], "must be above 0"),
        (["plan", "--log-level", "x", "--input", "-"], "--log-level: 'x' is not one of"),
        (["simulate", "--trace", str(TRACE), "--nodes", "many"], "--nodes: invalid int value"),
        (["demo", "--nodes", "0"], "must be positive"),
        (["testbed", "run", "--dir", "d", "--port", "p"], "--port: invalid int value"),
        (["testbed", "build", "--version", "1.2.3"], "is not one the testbed builds"),
    ],
)
def test_a_bad_flag_value_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert message in err
    assert "Traceback" not in err


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "NODE_NAME"))}
    return {**env, "HOME": str(tmp_path), **extra}


KUBECONFIGS = {
    "missing": None,
    "not YAML": "clusters: [\n",
    "no current-context": "apiVersion: v1\nkind: Config\nclusters: []\n",
}


@pytest.mark.parametrize("command", ["operator", "agent"])
@pytest.mark.parametrize("case", sorted(KUBECONFIGS))
def test_a_missing_or_broken_kubeconfig_is_one_line_and_exit_2(
    command: str, case: str, tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig"
    text = KUBECONFIGS[case]
    if text is not None:
        path.write_text(text)
    argv = [command, "--kubeconfig", str(path), "--metrics-port", "0"]
    if command == "agent":
        argv += ["--node-name", "n1", "--simulate", "NVIDIA H100 80GB HBM3:1"]
    proc = run_process(argv, _env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines == [lines[0]], proc.stderr
    assert lines[0].startswith(f"migpart {command}: kubeconfig {path}")
    assert proc.stdout == ""


@pytest.mark.parametrize("command", ["operator", "agent"])
def test_no_kubeconfig_anywhere_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    argv = [command, "--metrics-port", "0"]
    if command == "agent":
        argv += ["--node-name", "n1", "--simulate", "NVIDIA H100 80GB HBM3:1"]
    proc = run_process(argv, _env(tmp_path))  # no $KUBECONFIG, an empty $HOME, no cluster
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"migpart {command}: no kubeconfig: not running in a cluster, --kubeconfig not given, "
        "and ~/.kube/config does not exist ($KUBECONFIG is not set)"
    ]


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parsers = {
        "operator": operator.parser(),
        "agent": agent.parser(),
        "plan": plan._parser(),
        "simulate": simulate._parser(),
        "demo": demo.parser(),
    }
    top = testbed.parser()
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parsers[f"testbed {name}"] = sub
    return parsers


@pytest.mark.parametrize("name", sorted(_parsers()))
def test_every_help_shows_the_defaults(name: str) -> None:
    make = _parsers()[name]
    formatter: Callable[[], argparse.HelpFormatter] = make._get_formatter
    for action in make._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            continue
        text = formatter()._expand_help(action) if action.help else ""
        assert "default" in text.lower(), f"migpart {name} {action.option_strings[0]}: {text!r}"
    assert "(default" in make.format_help()


@pytest.mark.parametrize("argv", [["demo"], ["testbed", "build"]])
def test_outside_a_checkout_demo_and_testbed_say_so(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIGPART_TESTBED_SRC", "/nonexistent/hack/testbed")
    code, out, err = run(argv, capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(f"migpart {argv[0]}: needs a checkout of the migpart repository")
    assert out == ""


def test_simulate_progress_goes_to_stderr_and_stdout_stays_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 1,000 pods: 2,000 events, a step every 500
    argv = ["--trace", str(TRACE), "--nodes", "2", "--limit", "1000", "--policies", "first-fit"]
    assert simulate.main([*argv, "--json", "--progress"]) == 0
    out, err = capsys.readouterr()
    assert set(json.loads(out)["policies"]) == {"first-fit"}
    steps = err.splitlines()
    assert steps == [f"first-fit seed 1: {p}%" for p in (20, 50, 70, 100)], err
    assert simulate.main([*argv, "--json", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""

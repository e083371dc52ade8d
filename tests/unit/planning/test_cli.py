"""`migpart plan`: exit codes, one-line errors, stdout or --output, via main() and a process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from migpart.commands.plan import main
from tests.unit.planning.factories import BASE, EXAMPLE


def write(tmp_path: Path, body: object, name: str = "snapshot.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(body))
    return path


def test_plan_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--input", str(write(tmp_path, BASE))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"gpus", "assignments", "unsatisfied", "stats"}
    assert out["unsatisfied"] == []
    assert out["assignments"][0]["node"] == "n1"
    assert {"destroyed", "created", "gpusChanged", "planMillis"} == set(out["stats"])


def test_plan_to_output_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "plan.json"
    assert main(["--input", str(EXAMPLE), "--output", str(target)]) == 0
    assert capsys.readouterr().out == ""
    plan = json.loads(target.read_text())
    assert len(plan["gpus"]) == 3
    assert plan["unsatisfied"] == []


def test_plan_with_a_full_policy_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fields of a GpuPartitionPolicy spec that the planner does not read are accepted, and
    the ones it reads apply: 1g.10gb is denied, so the request takes the free 1g.10gb only."""
    policy = {
        "mode": "DryRun",
        "nodeSelector": {"matchLabels": {"pool": "a"}},
        "profiles": {"deny": ["1g.10gb"]},
        "reconfiguration": {"maxConcurrentNodes": 2},
    }
    assert main(["--input", str(write(tmp_path, {**BASE, "policy": policy}))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unsatisfied"] == ["r"]  # two devices wanted, one may not be created
    assert out["stats"]["created"] == 0


BAD = [
    ("missing file", None, "--input: cannot read"),
    ("malformed JSON", "{not json", "--input: invalid JSON at line 1"),
    (
        "unknown model",
        {"nodes": [{"name": "n", "gpus": [{"index": 0, "model": "X"}]}]},
        "nodes[0].gpus[0].model: unknown model and no profile table given",
    ),
    (
        "zero count",
        {"nodes": [], "requests": [{"name": "r", "profiles": ["1g.10gb"], "count": 0}]},
        "requests[0].count: must be at least 1",
    ),
    (
        "policy field the api model does not know",
        {"nodes": [], "policy": {"profiles": {"allow": ["1g.10gb"]}, "colour": "blue"}},
        "policy.colour: Extra inputs are not permitted",
    ),
]


@pytest.mark.parametrize(("name", "body", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, body: object, message: str
) -> None:
    if body is None:
        path = tmp_path / "absent.json"
    elif isinstance(body, str):
        path = tmp_path / "bad.json"
        path.write_text(body)
    else:
        path = write(tmp_path, body)
    assert main(["--input", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(message), lines[0]


def test_missing_argument_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_subprocess_plan(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "migpart.cli", "plan", "--input", str(EXAMPLE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["assignments"]) == 3
    assert "plan_computed" in ok.stderr
    bad = write(tmp_path, {"nodes": [{"name": "n", "gpus": [{"index": 0, "model": "X"}]}]})
    failed = subprocess.run(
        [sys.executable, "-m", "migpart.cli", "plan", "--input", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert failed.returncode == 2
    assert failed.stdout == ""
    assert failed.stderr == ("nodes[0].gpus[0].model: unknown model and no profile table given\n")

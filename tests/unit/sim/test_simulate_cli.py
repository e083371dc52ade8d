"""`migpart simulate`: the table, the ratio line, JSON, plots, and one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from migpart.commands import simulate
from migpart.sim.report import verdict
from migpart.sim.run import BUILTIN, VARIANTS

TRACE = Path(__file__).parents[2] / "fixtures" / "traces" / "openb_pod_list_default.csv"
SHORT = ["--trace", str(TRACE), "--nodes", "2", "--offset", "1000", "--limit", "150"]


def test_the_table_and_the_ratio_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate.main([*SHORT, "--load", "0.9", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    for policy in BUILTIN:
        assert f"\n{policy} " in out
    for variant in VARIANTS:  # run only when named
        assert f"\n{variant} " not in out
    assert "creates" in out
    assert "planner cpu s/day" in out
    ratio = out.strip().splitlines()[-1]
    assert ratio.startswith("migpart mean wait over 2 seed(s): vs mig-off ")
    assert "vs first-fit" in ratio
    assert any(word in ratio for word in ("(win)", "(tie)", "(loss)"))


def test_json_and_a_mig_parted_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(
        "version: v1\nmig-configs:\n  mine:\n    - devices: all\n      mig-enabled: true\n"
        "      mig-devices: {'3g.40gb': 2}\n"
    )
    args = [*SHORT, "--policies", "static:mine,first-fit,migpart", "--mig-config", str(config)]
    assert simulate.main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["policies"]) == {"static:mine", "first-fit", "migpart"}
    assert doc["policies"]["migpart"]["served"]["mean"] == 150
    assert doc["ratios"]["first-fit"]["verdict"] in {"win", "tie", "loss"}
    assert doc["perSeed"]["first-fit"][0]["creates"] > 0


def test_plots_are_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plots"
    args = [*SHORT, "--policies", "all-7g,first-fit", "--plot", str(out)]
    assert simulate.main(args) == 0
    for name in ("wait_cdf.png", "utilisation.png", "pending.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_a_missing_matplotlib_is_a_clear_error_before_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert simulate.main([*SHORT, "--plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("--plot: needs matplotlib")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "magic"], "--policies: unknown policy ['magic']"),
        (["--nodes", "0"], "--nodes: must be at least 1"),
        (["--load", "-1"], "--load: must be above 0"),
        (["--spares", "1g.10gb"], "--spares[0]: expected PROFILE:COUNT"),
        (["--model", "GeForce"], "--model: unknown model 'GeForce'"),
    ],
)
def test_bad_options_get_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert simulate.main([*SHORT, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1


def test_missing_trace_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate.main(["--trace", "/nonexistent.csv"]) == 2
    assert capsys.readouterr().err.startswith("--trace: cannot read /nonexistent.csv")


@pytest.mark.parametrize(
    ("ratios", "word"),
    [([0.5, 0.6, 0.55], "win"), ([1.5, 1.4, 1.6], "loss"), ([0.9, 1.1, 0.95], "tie"),
     ([0.97, 0.8, 0.99], "tie")],
)  # fmt: skip
def test_a_difference_within_the_noise_is_a_tie(ratios: list[float], word: str) -> None:
    assert verdict(ratios) == word


def test_the_simulate_doc_names_only_real_flags() -> None:
    import re

    doc = (Path(__file__).parents[3] / "docs" / "simulate.md").read_text()
    known = set(re.findall(r"--[a-z][a-z0-9-]*", simulate._parser().format_help()))
    mentioned = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", doc))
    assert mentioned - {"--help"} <= known, sorted(mentioned - known)


def test_nvidias_stock_config_is_simulated_with_one_warning_per_skip(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """mig-parted's own example names A100-40GB profiles (1g.5gb, ...): on the default H100
    those configs are left out in one line, and custom-config keeps what the H100 offers."""
    stock = Path(__file__).parents[2] / "fixtures" / "mig-parted" / "mig-parted-example-config.yaml"
    args = [*SHORT, "--policies", "static:custom-config,static:all-1g.10gb", "--mig-config"]
    assert simulate.main([*args, str(stock), "--json"]) == 0
    captured = capsys.readouterr()
    assert set(json.loads(captured.out)["policies"]) == {
        "static:custom-config",
        "static:all-1g.10gb",
    }
    warnings = captured.err.splitlines()
    assert len(warnings) == 4
    assert all(line.startswith("migpart simulate: warning: ") for line in warnings)
    assert (
        "left out: all-1g.5gb, all-1g.5gb.me, all-2g.10gb, all-3g.20gb, all-balanced"
        in warnings[-1]
    )


def test_a_variant_runs_when_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate.main([*SHORT, "--policies", "first-fit,offer-name-order", "--seeds", "1"]) == 0
    assert "\noffer-name-order " in capsys.readouterr().out

"""`migpart operator` flags: defaults, and bad values refused with a message."""

from __future__ import annotations

import pytest

from migpart.commands.operator import parse_args


def test_defaults() -> None:
    args = parse_args([])
    assert args.tick_seconds == 1.0
    assert args.withdraw_grace_seconds == 1.0


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_withdraw_grace_must_be_seconds(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--withdraw-grace-seconds", value])
    assert exit_.value.code == 2
    assert "--withdraw-grace-seconds" in capsys.readouterr().err


def test_there_is_no_peering_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """Replicas are coordinated by leader election; kopf's peering is not offered."""
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--peering"])
    assert exit_.value.code == 2
    assert "--peering" in capsys.readouterr().err


def test_withdraw_grace_zero_is_allowed() -> None:
    assert parse_args(["--withdraw-grace-seconds", "0"]).withdraw_grace_seconds == 0.0


def test_offer_publishing_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIGPART_OFFER_PUBLISHING", raising=False)
    assert parse_args([]).offer_publishing is False
    assert parse_args(["--offer-publishing"]).offer_publishing is True
    monkeypatch.setenv("MIGPART_OFFER_PUBLISHING", "true")
    assert parse_args([]).offer_publishing is True
    assert parse_args(["--no-offer-publishing"]).offer_publishing is False
    monkeypatch.setenv("MIGPART_OFFER_PUBLISHING", "no")
    assert parse_args([]).offer_publishing is False


def test_the_operator_manages_the_opted_in_nodes_unless_told_otherwise() -> None:
    default = parse_args([]).node_selector
    assert default.matches({"migpart.io/managed": "true"})
    assert not default.matches({"nvidia.com/gpu.present": "true"})
    assert not default.matches({"migpart.io/managed": "false"})
    every = parse_args(["--node-selector", ""]).node_selector
    assert every.matches({})
    pool = parse_args(["--node-selector", "pool=a, gpu"]).node_selector
    assert pool.matches({"pool": "a", "gpu": ""})
    assert not pool.matches({"pool": "a"})


@pytest.mark.parametrize("value", ["pool in (a,b)", "pool!=a", "=a", "a,,b"])
def test_a_node_selector_it_cannot_read_is_refused(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--node-selector", value])
    err = capsys.readouterr().err
    assert "--node-selector" in err
    assert "cannot read" in err

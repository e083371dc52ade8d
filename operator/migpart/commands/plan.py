"""`migpart plan --input SNAPSHOT.json [--output PLAN.json]`: the planner, offline.

The same pure `migpart.planning.planner.plan` that the operator runs, fed from a file, so that a
platform team can ask "what would migpart do to this cluster" without a cluster. Exit 0 with a
plan (even one that satisfies nothing), 2 with one line on stderr naming the offending field.

The snapshot's optional `policy` is parsed here, by the same `GpuPartitionPolicySpec` model
that parses the operator's policies (planning may not import the api), so any spec the cluster
accepts is accepted here too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from migpart.api.models import GpuPartitionPolicySpec, ProfileInfo
from migpart.commands.options import ReturningParser, UsageError, log_level
from migpart.errors import InvalidInput
from migpart.mig import Profile
from migpart.planning.codec import Parsers, encode_plan, parse_input
from migpart.planning.model import PolicyView
from migpart.planning.planner import plan


def _parser() -> argparse.ArgumentParser:
    parser = ReturningParser(prog="migpart plan", description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="snapshot JSON file ('-' for stdin)")
    parser.add_argument("--output", help="write the plan JSON here instead of stdout")
    parser.add_argument(
        "--log-level", type=log_level, default="INFO", help="stderr log level (default INFO)"
    )
    return parser


def _read(source: str) -> object:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput("--input", f"cannot read {source}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput("--input", f"{source} is not UTF-8 text: {exc.reason}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            "--input", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


def _invalid(error: ValidationError) -> InvalidInput:
    """The first error, with its path written the contract's way (`profiles.allow[0]`)."""
    first = error.errors()[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
    return InvalidInput(where.removeprefix("."), first["msg"])


def policy_view(raw: object) -> PolicyView:
    """What a GpuPartitionPolicy spec lets the planner do."""
    try:
        return GpuPartitionPolicySpec.model_validate(raw).policy_view()
    except ValidationError as error:
        raise _invalid(error) from None


def profile(raw: object) -> Profile:
    """A model table's profile, parsed as the MigNode status's `ProfileInfo`."""
    try:
        return ProfileInfo.model_validate(raw).to_profile()
    except ValidationError as error:
        raise _invalid(error) from None


PARSERS = Parsers(policy=policy_view, profile=profile)


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
        document = _read(args.input)
        parsed = parse_input(document, PARSERS)
    except (UsageError, InvalidInput) as exc:
        print(str(exc).replace("\n", " "), file=sys.stderr)
        return 2

    started = time.perf_counter()
    result = plan(parsed.snapshot, parsed.requests, parsed.policy)
    plan_millis = (time.perf_counter() - started) * 1000
    text = json.dumps(encode_plan(result, plan_millis), indent=2) + "\n"
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"--output: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)

    # Imported here so that bad input never configures logging (one line on stderr, exactly).
    import structlog

    from migpart import logs

    logs.configure(args.log_level)
    structlog.get_logger("migpart.plan").info(
        "plan_computed",
        nodes=len(parsed.snapshot.nodes),
        requests=len(parsed.requests),
        satisfied=len(result.assignments),
        unsatisfied=len(result.unsatisfied),
        destroyed=result.stats.destroyed,
        created=result.stats.created,
        gpus_changed=result.stats.gpus_changed,
        plan_millis=round(plan_millis, 3),
    )
    return 0

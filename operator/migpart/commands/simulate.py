"""`migpart simulate --trace FILE --nodes N`: replay a pod trace under several policies.

Prints the table and the ratio line (or `--json`), and with `--plot DIR` writes PNGs. Exit 0
after a run, 2 with one line on stderr naming the bad option or trace field. See
docs/simulate.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from migpart.commands.options import ReturningParser, UsageError
from migpart.errors import InvalidInput
from migpart.mig import CATALOG
from migpart.planning.model import PolicyView, Spare
from migpart.sim.layouts import StaticLayout, mig_parted_layouts, read_mig_parted
from migpart.sim.migpart import MigpartSettings
from migpart.sim.report import as_json, ratio_line, table
from migpart.sim.run import BUILTIN, NAMED, VARIANTS, SimConfig, simulate
from migpart.sim.workload import load_workload

_DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"


def _parser() -> argparse.ArgumentParser:
    p = ReturningParser(prog="migpart simulate", description=__doc__.splitlines()[0])
    p.add_argument("--trace", required=True, help="Alibaba openb_pod_list CSV, or simple CSV/JSON")
    p.add_argument("--nodes", type=int, default=5, help="GPU nodes (default 5)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--model", default=_DEFAULT_MODEL, help=f"GPU model (default {_DEFAULT_MODEL})")
    p.add_argument(
        "--policies",
        default="all",
        help=f"'all' or a comma list of {', '.join(NAMED)} and static:NAME "
        "(default all: every one but the variants " + ", ".join(VARIANTS) + ")",
    )
    p.add_argument("--mig-config", help="mig-parted config file; each config is static:NAME")
    p.add_argument("--seeds", type=int, default=1, help="arrival-jitter replications (default 1)")
    p.add_argument("--load", type=float, help="scale arrivals to this offered load (e.g. 0.95)")
    p.add_argument("--speedup", type=float, default=1.0, help="divide all times by this")
    p.add_argument("--offset", type=int, default=0, help="skip this many pods of the trace")
    p.add_argument("--limit", type=int, help="replay at most this many pods")
    p.add_argument("--batch-window-s", type=float, default=2.0, help="migpart (default 2)")
    p.add_argument("--actuation-s", type=float, default=5.0, help="per GPU changed (default 5)")
    p.add_argument("--max-concurrent-nodes", type=int, default=1, help="migpart (default 1)")
    p.add_argument(
        "--age-s",
        type=float,
        default=1200.0,
        help="migpart: ageing, a pod waiting this long is not overtaken (default 1200; 0: off)",
    )
    p.add_argument(
        "--hold-used",
        type=float,
        default=0.5,
        help="migpart: keep a node free for the oldest multi-GPU pod when at most this share of"
        " it is in use (default 0.5; 0: never)",
    )
    p.add_argument(
        "--hold-s",
        type=float,
        default=1800.0,
        help="migpart: ... and its longest-running pod has run at most this long (default 1800)",
    )
    p.add_argument(
        "--spares-from-mix", type=int, default=0, help="migpart: this many spares, by recent mix"
    )
    p.add_argument("--spares", default="", help="migpart spares, e.g. 1g.10gb:2,3g.40gb:1")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr, stdout stays clean (default: a bar when stderr is a terminal)",
    )
    p.add_argument("--plot", help="write PNGs (matplotlib) into this directory")
    return p


def _spares(text: str) -> tuple[Spare, ...]:
    spares = []
    for k, item in enumerate(s for s in text.split(",") if s.strip()):
        profile, _, count = item.strip().partition(":")
        if not count.isdigit():
            raise InvalidInput(f"--spares[{k}]", f"expected PROFILE:COUNT, got {item.strip()!r}")
        spares.append(Spare(profile, int(count)))
    return tuple(spares)


def _static(path: str | None, gpus: int, model: str) -> dict[str, StaticLayout]:
    """The static policies of a mig-parted config for `model`; its warnings (profiles the
    model does not offer, configs left out) go to stderr, one line each."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput("--mig-config", f"cannot read {path}: {exc.strerror or exc}") from None
    found = mig_parted_layouts(CATALOG[model], read_mig_parted(text, path), gpus, path)
    for warning in found.warnings:
        print(f"migpart simulate: warning: {warning}", file=sys.stderr)
    return found.layouts


def _config(args: argparse.Namespace) -> SimConfig:
    if args.model not in CATALOG:
        raise InvalidInput("--model", f"unknown model {args.model!r} (known: {', '.join(CATALOG)})")
    table = CATALOG[args.model]
    for option in ("nodes", "gpus_per_node", "seeds", "max_concurrent_nodes"):
        if getattr(args, option) < 1:
            raise InvalidInput(f"--{option.replace('_', '-')}", "must be at least 1")
    for option in ("batch_window_s", "actuation_s", "age_s", "hold_used", "hold_s"):
        if getattr(args, option) < 0:
            raise InvalidInput(f"--{option.replace('_', '-')}", "must not be negative")
    static = _static(args.mig_config, args.gpus_per_node, args.model)
    if args.policies == "all":
        policies = (*BUILTIN, *static)
    else:
        policies = tuple(dict.fromkeys(p.strip() for p in args.policies.split(",") if p.strip()))
        unknown = [p for p in policies if p not in NAMED and p not in static]
        if unknown or not policies:
            known = ", ".join([*NAMED, *static])
            raise InvalidInput("--policies", f"unknown policy {unknown[:1]} (known: {known})")
    spares = _spares(args.spares)
    for spare in spares:
        if not table.has(spare.profile):
            raise InvalidInput("--spares", f"{spare.profile!r} is not offered by {table.model}")
    return SimConfig(
        table=table,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        policies=policies,
        static=static,
        seeds=args.seeds,
        load=args.load,
        speedup=args.speedup,
        actuation_s=args.actuation_s,
        planner_policy=PolicyView(spares=spares),
        migpart=MigpartSettings(
            batch_window_s=args.batch_window_s,
            max_concurrent_nodes=args.max_concurrent_nodes,
            age_s=args.age_s if args.age_s > 0 else None,
            spares_total=args.spares_from_mix,
            hold_used=args.hold_used if args.hold_used > 0 else None,
            hold_s=args.hold_s,
        ),
    )


class _Bar:
    """Progress on stderr: a bar redrawn in place on a terminal; elsewhere (`--progress` into
    a log) one line per tenth of each phase."""

    def __init__(self, enabled: bool | None) -> None:
        self.tty = sys.stderr.isatty()
        self.enabled = self.tty if enabled is None else enabled
        self.last = ""

    def __call__(self, label: str, fraction: float) -> None:
        if not self.enabled:
            return
        if not self.tty:
            line = f"{label}: {int(10 * min(1.0, fraction)) * 10}%\n"
        else:
            filled = int(30 * min(1.0, fraction))
            line = f"\r{label:<28} [{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%}"
        if line != self.last:
            sys.stderr.write(line)
            sys.stderr.flush()
            self.last = line

    def done(self) -> None:
        if self.enabled and self.tty and self.last:
            sys.stderr.write("\r" + " " * len(self.last) + "\r")
            sys.stderr.flush()


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
        config = _config(args)
        if args.offset < 0 or (args.limit is not None and args.limit < 1):
            raise InvalidInput("--offset/--limit", "offset must be >= 0 and limit >= 1")
        pods = load_workload(Path(args.trace), config.table)
        end = None if args.limit is None else args.offset + args.limit
        pods = pods[args.offset : end]
        if not pods:
            raise InvalidInput("--offset", f"the trace has no pod from {args.offset} on")
        if args.plot:
            from migpart.sim.plot import _pyplot

            _pyplot()  # a missing matplotlib is reported before the run, not after it
        bar = _Bar(args.progress)
        result = simulate(config, pods, bar)
        bar.done()
        if args.json:
            sys.stdout.write(json.dumps(as_json(result), indent=2) + "\n")
        else:
            load = "trace rate" if config.load is None else f"offered load {config.load:g}"
            shape = f"{config.nodes} x {config.gpus_per_node} {config.table.model}"
            print(f"{len(pods)} pods, {shape}, {load}")
            if result.best_static_mix:
                print(f"best-static: {result.best_static_mix.describe()}")
            print(table(result))
            print(ratio_line(result))
        if args.plot:
            from migpart.sim.plot import write_plots

            for path in write_plots(result, Path(args.plot)):
                print(f"wrote {path}", file=sys.stderr)
    except (UsageError, InvalidInput) as exc:
        print(str(exc).replace("\n", " "), file=sys.stderr)
        return 2
    return 0

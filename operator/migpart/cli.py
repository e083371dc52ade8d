"""`migpart operator | agent | plan | simulate | demo | testbed`: one entry point, one module per
command.

Each command lives in `migpart.commands.<name>` and exposes `main(argv) -> int`; it is imported
only when chosen, so `migpart plan` does not load kopf or NVML.
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

from migpart import revision

COMMANDS = {
    "operator": "run the operator (kopf) against the current kubeconfig",
    "agent": "run the node agent (real NVML, or --simulate MODEL:COUNT)",
    "plan": "plan offline: snapshot JSON in, plan JSON out",
    "simulate": "replay a pod trace under static, first-fit, MIG-off, migpart and offer policies",
    "demo": "local control plane, simulated GPU nodes, operator, agents and a trace replay",
    "testbed": "build or run the local Kubernetes control plane (hack/testbed)",
}


def version() -> str:
    """`migpart --version`: the installed package's version, and the image's git revision
    where the image says which it was built from."""
    try:
        text = f"migpart {metadata.version('migpart')}"
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        from migpart import __version__

        text = f"migpart {__version__}"
    built_from = revision()
    if built_from != "unknown":
        text += f" (revision {built_from})"
    return text


def usage() -> str:
    lines = ["usage: migpart COMMAND [ARGS...] | migpart --version", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, text in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0 if args else 2
    if args[0] in {"-V", "--version"}:
        print(version())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"migpart: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"migpart.commands.{name}")
    code: int = module.main(rest)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""What the tests, the benchmarks and the demo share: object builders and invariant checks.

Nothing on the operator's or the agent's path imports this package (an import-linter
contract); it lives in the package because `migpart demo` uses it too.
"""

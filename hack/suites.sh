#!/usr/bin/env bash
# The integration and e2e suites (tests/integration, tests/e2e) on each Kubernetes version given,
# side by side: each version's suite runs against testbeds of its own (free ports, its own
# pytest temp dir), and most of its time is spent waiting on its control plane and kubelets,
# so two versions on two cores take far less than one after the other (docs/testing.md).
# MIGPART_SUITES_SERIAL=1 runs them one after the other. The modules whose faults hang on
# timing (SERIAL: the chaos harness freezes operators and agents against Lease timeouts) run
# after that, one version at a time, on a machine not loaded by the other version: run beside
# it they counted writes of a replica that had just taken over as non-leader writes. Each
# part's output is printed whole when it ends, under a "== ..." line; the exit status is 1
# when any part failed.
#
#   hack/suites.sh 1.34.4 1.37.2            (make test and make suites call it)
#   PYTEST_ARGS="-x -k offer" hack/suites.sh 1.37.2
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# short: kubelets' plugin sockets live below the temp dirs (a 107-byte limit)
logs=$(mktemp -d /tmp/suites.XXXX)
status=0
SERIAL=(tests/integration/test_chaos.py tests/e2e/test_leader_election.py)

run() {
    local v=$1 ignore=()
    for f in "${SERIAL[@]}"; do ignore+=("--ignore=$f"); done
    mkdir -p "$logs/$v"
    # shellcheck disable=SC2086
    MIGPART_K8S_VERSION=$v "$PY" -m pytest tests/integration tests/e2e "${ignore[@]}" \
        -p no:cacheprovider --basetemp="$logs/$v/t" ${PYTEST_ARGS:-} >"$logs/$v.log" 2>&1
    echo $? >"$logs/$v.rc"
}

run_serial() {
    local v=$1 rc
    mkdir -p "$logs/$v"
    echo "== timing-sensitive modules on Kubernetes $v, alone"
    # shellcheck disable=SC2086
    MIGPART_K8S_VERSION=$v "$PY" -m pytest "${SERIAL[@]}" -p no:cacheprovider \
        --basetemp="$logs/$v/s" ${PYTEST_ARGS:-}
    rc=$?
    [ "$rc" = 0 ] || status=1
}

report() {
    local v=$1 rc
    rc=$(cat "$logs/$v.rc" 2>/dev/null || echo 1)
    echo "== integration and e2e on Kubernetes $v (exit $rc)"
    cat "$logs/$v.log"
    [ "$rc" = 0 ] || status=1
}

started=$(date +%s)
if [ "${MIGPART_SUITES_SERIAL:-0}" = 1 ]; then
    for v in "$@"; do run "$v"; report "$v"; done
else
    pids=()
    for v in "$@"; do
        run "$v" &
        pids+=($!)
    done
    # a line a minute, so that a CI log shows the run is alive
    while [ "$(find "$logs" -maxdepth 1 -name '*.rc' | wc -l)" -lt $# ]; do
        sleep 60
        for v in "$@"; do
            [ -f "$logs/$v.rc" ] || echo "-- $v: $(grep -c '' "$logs/$v.log") lines of output so far"
        done
    done
    wait "${pids[@]}"
    for v in "$@"; do report "$v"; done
fi
for v in "$@"; do run_serial "$v"; done
echo "== suites on $* took $(($(date +%s) - started)) s"
rm -rf "$logs"
exit $status

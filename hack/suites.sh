#!/usr/bin/env bash
# The integration and e2e suites (tests/integration, tests/e2e) on each Kubernetes version given,
# side by side: each version's suite runs against testbeds of its own (free ports, its own
# pytest temp dir), and most of its time is spent waiting on its control plane and kubelets,
# so two versions on two cores take far less than one after the other (docs/testing.md).
# With OFFER_K8S_VERSION and OFFER_MODULES set (make test sets both, see the Makefile), only
# those modules also run on that version, as a third part beside the two: offer mode on the
# first version that serves it, without a third full suite (a SERIAL module listed there is
# left out of it, as out of the full suites).
# MIGPART_SUITES_SERIAL=1 runs them one after the other. The modules whose faults hang on
# timing (SERIAL: the chaos harness freezes operators and agents against Lease timeouts) run
# after that, one version at a time, on a machine not loaded by the other version: run beside
# it they counted writes of a replica that had just taken over as non-leader writes. Each
# part's output is printed whole when it ends, under a "== ..." line; the exit status is 1
# when any part failed.
#
#   hack/suites.sh 1.34.4 1.37.2            (make test and make suites call it)
#   PYTEST_ARGS="-x -k offer" hack/suites.sh 1.37.2
#   OFFER_K8S_VERSION=1.36.3 OFFER_MODULES=tests/e2e/test_offer_mode.py hack/suites.sh 1.37.2
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# short: kubelets' plugin sockets live below the temp dirs (a 107-byte limit)
logs=$(mktemp -d /tmp/suites.XXXX)
status=0
SERIAL=(tests/integration/test_chaos.py tests/e2e/test_leader_election.py)
OFFER_K8S_VERSION=${OFFER_K8S_VERSION:-}
read -ra OFFER_MODULES <<<"${OFFER_MODULES:-}"

# The parts: a version's full suite is named by the version, the offer-mode modules "offer-V".
parts=("$@")
if [ -n "$OFFER_K8S_VERSION" ] && [ ${#OFFER_MODULES[@]} -gt 0 ]; then
    parts+=("offer-$OFFER_K8S_VERSION")
fi

run() {
    local part=$1 v=$1 paths=(tests/integration tests/e2e)
    if [ "${part#offer-}" != "$part" ]; then
        v=${part#offer-}
        paths=("${OFFER_MODULES[@]}")
    fi
    for f in "${SERIAL[@]}"; do paths+=("--ignore=$f"); done
    mkdir -p "$logs/$part"
    # shellcheck disable=SC2086
    MIGPART_K8S_VERSION=$v "$PY" -m pytest "${paths[@]}" \
        -p no:cacheprovider --basetemp="$logs/$part/t" ${PYTEST_ARGS:-} >"$logs/$part.log" 2>&1
    echo $? >"$logs/$part.rc"
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
    local part=$1 rc
    rc=$(cat "$logs/$part.rc" 2>/dev/null || echo 1)
    if [ "${part#offer-}" != "$part" ]; then
        echo "== offer-mode modules on Kubernetes ${part#offer-}: ${OFFER_MODULES[*]} (exit $rc)"
    else
        echo "== integration and e2e on Kubernetes $part (exit $rc)"
    fi
    cat "$logs/$part.log"
    [ "$rc" = 0 ] || status=1
}

started=$(date +%s)
if [ "${MIGPART_SUITES_SERIAL:-0}" = 1 ]; then
    for part in "${parts[@]}"; do run "$part"; report "$part"; done
else
    pids=()
    for part in "${parts[@]}"; do
        run "$part" &
        pids+=($!)
    done
    # a line a minute, so that a CI log shows the run is alive
    while [ "$(find "$logs" -maxdepth 1 -name '*.rc' | wc -l)" -lt ${#parts[@]} ]; do
        sleep 60
        for part in "${parts[@]}"; do
            [ -f "$logs/$part.rc" ] || echo "-- $part: $(grep -c '' "$logs/$part.log") lines of output so far"
        done
    done
    wait "${pids[@]}"
    for part in "${parts[@]}"; do report "$part"; done
fi
for v in "$@"; do run_serial "$v"; done
echo "== suites on ${parts[*]} took $(($(date +%s) - started)) s"
rm -rf "$logs"
exit $status

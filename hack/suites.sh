#!/usr/bin/env bash
# The integration and e2e suites (tests/integration, tests/e2e) on each Kubernetes version given,
# side by side: each version's suite runs against testbeds of its own (free ports, its own
# pytest temp dir), and most of its time is spent waiting on its control plane and kubelets,
# so two versions on two cores take far less than one after the other (docs/testing.md).
# With OFFER_K8S_VERSION and OFFER_MODULES set (make test sets both, see the Makefile), only
# those modules also run on that version, as a part of its own: offer mode on the first
# version that serves it, without a third full suite (a SERIAL module listed there is left
# out of it, as out of the full suites).
# The modules whose faults race Lease timeouts (SERIAL: the chaos harness freezes operators
# and agents past their Leases) run as one part per version, never two of them at once: one
# after the other in a lane of their own, after the offer part (the shortest), beside the
# full suites. MIGPART_SUITES_TIMING_ALONE=1 runs them after everything else instead, alone
# on the machine, one version at a time (how they ran until side-by-side runs showed them
# clean); MIGPART_SUITES_SERIAL=1 runs every part one after the other. Each part's output is
# printed whole when it ends, under a "== ..." line; the exit status is 1 when any part failed.
# With SUITES_UNIT=1 (make test) the unit tests are a part too, first in the first version's
# lane (the shortest full suite): they need no control plane, and run while the other lanes'
# testbeds start, instead of before every lane.
# Each part first builds its version's testbed where the cache lacks it (make test does not
# build them beforehand): on a new machine the lanes' builds run beside the unit tests and
# the suites' waits on their control planes, instead of all before any test.
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

# The parts: a version's full suite is named by the version, the offer-mode modules "offer-V",
# the timing-sensitive modules of a version "timing-V".
offer=()
if [ -n "$OFFER_K8S_VERSION" ] && [ ${#OFFER_MODULES[@]} -gt 0 ]; then
    offer=("offer-$OFFER_K8S_VERSION")
fi
timing=()
for v in "$@"; do timing+=("timing-$v"); done
unit=()
[ "${SUITES_UNIT:-0}" = 1 ] && unit=(unit)
parts=("${unit[@]}" "$@" "${offer[@]}" "${timing[@]}")

# The lanes run side by side, each its parts one after the other (a lane is a
# space-separated list of parts): a full suite each, and one lane for the offer part and then
# the timing-sensitive ones (together about as long as the longest full suite).
lanes=("$@")
[ ${#unit[@]} -eq 0 ] || lanes[0]="unit ${lanes[0]:-}"
if [ "${MIGPART_SUITES_TIMING_ALONE:-0}" = 1 ]; then
    last="${offer[*]}"
else
    last="${offer[*]} ${timing[*]}"
fi
last=${last# }
[ -z "$last" ] || lanes+=("$last")

run() {
    local part=$1 v=$1 paths=(tests/integration tests/e2e)
    case $part in
    offer-*)
        v=${part#offer-}
        paths=("${OFFER_MODULES[@]}")
        ;;
    timing-*)
        v=${part#timing-}
        paths=("${SERIAL[@]}")
        ;;
    unit)
        v=""
        paths=(tests --ignore=tests/integration --ignore=tests/e2e)
        ;;
    esac
    # the timing-sensitive modules run only in their own parts
    if [ "${part#timing-}" = "$part" ]; then
        for f in "${SERIAL[@]}"; do paths+=("--ignore=$f"); done
    fi
    mkdir -p "$logs/$part"
    local began=$SECONDS rc=0
    : >"$logs/$part.log"
    # The part's testbed, built here when the cache lacks it (a cache hit takes a fraction of a
    # second; a lane that needs a version another lane is building waits on that build's lock),
    # so that on a new machine one lane's build runs beside the parts that need none.
    if [ -n "$v" ]; then
        MIGPART_K8S_VERSION=$v "$PY" -m migpart.cli testbed build >>"$logs/$part.log" 2>&1 || rc=$?
        echo $((SECONDS - began)) >"$logs/$part.build.s"
    fi
    if [ "$rc" = 0 ]; then
        # shellcheck disable=SC2086
        env ${v:+MIGPART_K8S_VERSION=$v} "$PY" -m pytest "${paths[@]}" \
            -p no:cacheprovider --basetemp="$logs/$part/t" ${PYTEST_ARGS:-} >>"$logs/$part.log" 2>&1
        rc=$?
    fi
    echo "$rc" >"$logs/$part.rc"
    echo $((SECONDS - began)) >"$logs/$part.s"
}

report() {
    local part=$1 rc
    rc=$(cat "$logs/$part.rc" 2>/dev/null || echo 1)
    case $part in
    offer-*) echo "== offer-mode modules on Kubernetes ${part#offer-}: ${OFFER_MODULES[*]} (exit $rc)" ;;
    timing-*) echo "== timing-sensitive modules on Kubernetes ${part#timing-}: ${SERIAL[*]} (exit $rc)" ;;
    unit) echo "== unit tests: tests without tests/integration and tests/e2e (exit $rc)" ;;
    *) echo "== integration and e2e on Kubernetes $part (exit $rc)" ;;
    esac
    cat "$logs/$part.log"
    [ "$rc" = 0 ] || status=1
}

lane() {
    local part
    for part in $1; do run "$part"; done
}

started=$(date +%s)
if [ "${MIGPART_SUITES_SERIAL:-0}" = 1 ]; then
    for part in "${parts[@]}"; do run "$part"; report "$part"; done
else
    pids=()
    for l in "${lanes[@]}"; do
        lane "$l" &
        pids+=($!)
    done
    # a line a minute, so that a CI log shows the run is alive
    alone=0
    [ "${MIGPART_SUITES_TIMING_ALONE:-0}" = 1 ] && alone=${#timing[@]}
    ticks=0
    while [ "$(find "$logs" -maxdepth 1 -name '*.rc' | wc -l)" -lt $((${#parts[@]} - alone)) ]; do
        sleep 5
        ticks=$((ticks + 1))
        [ $((ticks % 12)) = 0 ] || continue
        for part in "${parts[@]}"; do
            [ -f "$logs/$part.log" ] && [ ! -f "$logs/$part.rc" ] &&
                echo "-- $part: $(grep -c '' "$logs/$part.log") lines of output so far"
        done
    done
    wait "${pids[@]}"
    if [ "$alone" -gt 0 ]; then
        for part in "${timing[@]}"; do run "$part"; done
    fi
    for part in "${parts[@]}"; do report "$part"; done
fi
echo "== suites on ${parts[*]} took $(($(date +%s) - started)) s ($(for part in "${parts[@]}"; do
    build=$(cat "$logs/$part.build.s" 2>/dev/null || echo 0)
    printf '%s %s s%s; ' "$part" "$(cat "$logs/$part.s" 2>/dev/null || echo '?')" \
        "$([ "$build" -gt 1 ] && echo " with a $build s testbed build")"
done | sed 's/; $//'))"
rm -rf "$logs"
exit $status

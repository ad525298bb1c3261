#!/bin/sh
# pk-record.sh — record a PostgreSQL backend with perf where profkit is not installed.
#
#   sh pk-record.sh PID [SECONDS [FREQ]] [-o OUT.tar.gz]
#
# Records backend PID for SECONDS (default 10) with frame-pointer call graphs
# (perf record -F FREQ -g -p PID, default 999 Hz; stopped with SIGINT), then writes
# into one tarball:
#   perf.data          the recording
#   perf.script.txt    perf script with the fields profkit reads
#                      (-F comm,tid,time,period,event,ip,sym,dso --no-inline)
#   perf-record.log    perf record's messages
#   buildid-list.txt   perf buildid-list (DSO build-ids as recorded)
#   vdso.so            the kernel's vDSO image, when perf cached it (names [vdso] frames)
#   capture.txt        provenance: uname -a, perf version, the backend's PostgreSQL
#                      version (/proc/PID/exe --version), clocksource, times, pid
# Bring the tarball to a machine with profkit:  profkit import OUT.tar.gz
#
# Needs only a POSIX sh (dash is enough) and these programs on the PATH:
#   perf tar gzip uname date sleep mkdir rm cp
# (cat, kill, read are the shell's own or optional). Run it as root, or as a user that may
# perf the backend (kernel.perf_event_paranoid, or the postgres user for its own backends).
set -u

usage() {
    echo "usage: pk-record.sh PID [SECONDS [FREQ]] [-o OUT.tar.gz]" >&2
    exit 2
}

die() {
    echo "pk-record.sh: $*" >&2
    exit 1
}

out=""
pid=""
seconds=10
freq=999
n=0
while [ $# -gt 0 ]; do
    case "$1" in
        -o) [ $# -ge 2 ] || usage; out=$2; shift 2; continue ;;
        -h|--help) usage ;;
        -*) usage ;;
    esac
    n=$((n + 1))
    case $n in
        1) pid=$1 ;;
        2) seconds=$1 ;;
        3) freq=$1 ;;
        *) usage ;;
    esac
    shift
done
[ -n "$pid" ] || usage
case "$pid" in ''|*[!0-9]*) die "PID must be a number, got '$pid'" ;; esac
case "$seconds" in ''|*[!0-9]*|0) die "SECONDS must be a whole number > 0, got '$seconds'" ;; esac
case "$freq" in ''|*[!0-9]*|0) die "FREQ must be a whole number > 0, got '$freq'" ;; esac

for tool in perf tar gzip uname date sleep mkdir rm cp; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is not on the PATH (needed: perf tar gzip uname date sleep mkdir rm cp)"
done

[ -d "/proc/$pid" ] || die "no process $pid: give the pid of a PostgreSQL backend (SELECT pg_backend_pid())"
comm=""
if [ -r "/proc/$pid/comm" ]; then
    IFS= read -r comm < "/proc/$pid/comm" || true
fi
case "$comm" in
    postgres|postmaster|postgres:*) ;;
    *) die "process $pid is '$comm', not a PostgreSQL backend: give the pid of a backend (SELECT pg_backend_pid())" ;;
esac

stamp=$(date -u +%Y%m%d-%H%M%S)
host=$(uname -n)
name="pk-record-$host-$pid-$stamp"
[ -n "$out" ] || out="$name.tar.gz"
tmp="${TMPDIR:-/tmp}/$name.$$"
mkdir -p "$tmp/$name" || die "cannot create $tmp"
dir="$tmp/$name"
perf_pid=""

cleanup() {
    if [ -n "$perf_pid" ]; then
        kill -TERM "$perf_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# a private build-id cache, so the vDSO perf saves can be found (and ~/.debug is left alone)
bid="$dir/buildid"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
perf --buildid-dir "$bid" record -F "$freq" -g -p "$pid" -o "$dir/perf.data" \
    >"$dir/perf-record.log" 2>&1 &
perf_pid=$!
sleep "$seconds"
if kill -INT "$perf_pid" 2>/dev/null; then
    wait "$perf_pid"
    rc=$?
else
    wait "$perf_pid"
    rc=$?
fi
perf_pid=""
ended=$(date -u +%Y-%m-%dT%H:%M:%SZ)
[ -s "$dir/perf.data" ] || die "perf record wrote nothing (exit $rc): $(cat "$dir/perf-record.log" 2>/dev/null)"

perf --buildid-dir "$bid" script -i "$dir/perf.data" -F comm,tid,time,period,event,ip,sym,dso \
    --no-inline >"$dir/perf.script.txt" 2>"$dir/perf-script.err" \
    || die "perf script failed: $(cat "$dir/perf-script.err")"
perf --buildid-dir "$bid" buildid-list -i "$dir/perf.data" >"$dir/buildid-list.txt" 2>/dev/null
for img in "$bid"/\[vdso\]/*/vdso; do
    if [ -f "$img" ]; then
        cp "$img" "$dir/vdso.so"
        break
    fi
done
rm -rf "$bid"

clocksource=""
cs=/sys/devices/system/clocksource/clocksource0/current_clocksource
if [ -r "$cs" ]; then
    IFS= read -r clocksource < "$cs" || true
fi
pgversion=$("/proc/$pid/exe" --version 2>/dev/null) || pgversion=""
{
    echo "format=pk-record 1"
    echo "pid=$pid"
    echo "comm=$comm"
    echo "seconds=$seconds"
    echo "freq=$freq"
    echo "call_graph=fp"
    echo "started_at=$started"
    echo "ended_at=$ended"
    echo "perf_record_exit=$rc"
    echo "hostname=$host"
    echo "uname=$(uname -a)"
    echo "kernel=$(uname -r)"
    echo "machine=$(uname -m)"
    echo "perf_version=$(perf version 2>/dev/null)"
    echo "postgres_version=$pgversion"
    echo "clocksource=$clocksource"
} >"$dir/capture.txt"

tar -C "$tmp" -czf "$out" "$name" || die "cannot write $out"
echo "$out"

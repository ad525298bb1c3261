#!/bin/sh
# pk-record.sh — record a PostgreSQL backend with perf where profkit is not installed.
#
#   sh pk-record.sh PID [SECONDS [FREQ]] [-o OUT.tar.gz]
#   sh pk-record.sh --query-file FILE.sql [--repeat N] [-F FREQ] [-o OUT.tar.gz] [-- PSQL_ARGS...]
#
# The first form records backend PID for SECONDS (default 10) with frame-pointer call
# graphs (perf record -F FREQ -g -p PID, default 999 Hz; stopped with SIGINT).
# The second records one query: it starts psql (PSQL_ARGS: -h/-p/-U/-d, or a conninfo
# string "host=... dbname=..."), takes SELECT pg_backend_pid() in that session, attaches
# perf to that backend, sends FILE.sql in the same session (N times with --repeat N, perf
# attached across all of them: a short query gives too few samples at any sane -F), and
# stops perf as soon as psql has printed the last result (an \echo marker after it). The
# last run's output is kept, and psql's \timing of each statement.
# Either way it writes into one tarball:
#   perf.data          the recording
#   perf.script.txt    perf script with the fields profkit reads
#                      (-F comm,tid,time,period,event,ip,sym,dso --no-inline)
#   perf-record.log    perf record's messages
#   buildid-list.txt   perf buildid-list (DSO build-ids as recorded)
#   vdso.so            the kernel's vDSO image, when perf cached it (names [vdso] frames)
#   capture.txt        provenance: uname -a, perf version, the backend's PostgreSQL
#                      version (/proc/PID/exe --version), clocksource, times, pid
#   query.sql          (--query-file) the query as sent, and query-output.txt its output
#                      (capture.txt: repeat=N, query_ms= psql's time of every statement sent)
# Bring the tarball to a machine with profkit:  profkit import OUT.tar.gz
#
# Needs only a POSIX sh (dash is enough) and these programs on the PATH:
#   perf tar gzip uname date sleep mkdir rm cp
# (cat, kill, read are the shell's own or optional); --query-file also needs psql, mkfifo
# and tail. Run it as root, or as a user that may
# perf the backend (kernel.perf_event_paranoid, or the postgres user for its own backends).
set -u

usage() {
    echo "usage: pk-record.sh PID [SECONDS [FREQ]] [-o OUT.tar.gz]" >&2
    echo "       pk-record.sh --query-file FILE.sql [--repeat N] [-F FREQ] [-o OUT.tar.gz] [-- PSQL_ARGS...]" >&2
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
qfile=""
repeat=""
n=0
while [ $# -gt 0 ]; do
    case "$1" in
        -o) [ $# -ge 2 ] || usage; out=$2; shift 2; continue ;;
        -F) [ $# -ge 2 ] || usage; freq=$2; shift 2; continue ;;
        --query-file) [ $# -ge 2 ] || usage; qfile=$2; shift 2; continue ;;
        --repeat) [ $# -ge 2 ] || usage; repeat=$2; shift 2; continue ;;
        --) shift; break ;;
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
# what is left ("$@") are psql's arguments (--query-file only)
if [ -n "$qfile" ]; then
    [ -z "$pid" ] || die "give a PID or --query-file, not both (--query-file finds the backend itself)"
    { [ -f "$qfile" ] && [ -r "$qfile" ]; } || die "query file '$qfile' not found or not readable: give a file holding one SQL statement"
    [ -s "$qfile" ] || die "query file '$qfile' is empty: put the SQL statement to record in it"
    [ -n "$repeat" ] || repeat=1
    case "$repeat" in ''|*[!0-9]*|0) die "--repeat N must be a whole number > 0, got '$repeat'" ;; esac
else
    [ $# -eq 0 ] || die "psql arguments after -- need --query-file FILE.sql"
    [ -z "$repeat" ] || die "--repeat N repeats the query of --query-file FILE.sql: give that too"
    [ -n "$pid" ] || usage
    case "$pid" in ''|*[!0-9]*) die "PID must be a number, got '$pid'" ;; esac
    case "$seconds" in ''|*[!0-9]*|0) die "SECONDS must be a whole number > 0, got '$seconds'" ;; esac
fi
case "$freq" in ''|*[!0-9]*|0) die "FREQ must be a whole number > 0, got '$freq'" ;; esac

for tool in perf tar gzip uname date sleep mkdir rm cp; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is not on the PATH (needed: perf tar gzip uname date sleep mkdir rm cp)"
done
if [ -n "$qfile" ]; then
    for tool in psql mkfifo tail; do
        command -v "$tool" >/dev/null 2>&1 || die "$tool is not on the PATH (--query-file needs psql mkfifo tail)"
    done
fi

stamp=$(date -u +%Y%m%d-%H%M%S)
host=$(uname -n)
tmp="${TMPDIR:-/tmp}/pk-record-$host-$stamp.$$"
mkdir -p "$tmp" || die "cannot create $tmp"
perf_pid=""
psql_pid=""

# stop what this script started and wait for it (perf writes its build-id cache into
# $tmp as it exits: removing $tmp before that would leave it behind), then remove $tmp
cleanup() {
    if [ -n "$perf_pid" ]; then
        kill -TERM "$perf_pid" 2>/dev/null
        wait "$perf_pid" 2>/dev/null
    fi
    if [ -n "$psql_pid" ]; then
        exec 3>&- 2>/dev/null
        kill -TERM "$psql_pid" 2>/dev/null
        wait "$psql_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# psql's session: wait until its output ends with the line $1 (psql prints it after
# everything sent before it has run); fail with psql's own message if psql exits first
wait_for_line() {
    while :; do
        if [ -s "$tmp/psql.out" ] && [ "$(tail -n 1 "$tmp/psql.out")" = "$1" ]; then
            return 0
        fi
        if ! kill -0 "$psql_pid" 2>/dev/null; then
            msg=""
            if [ -r "$tmp/psql.err" ]; then
                IFS= read -r msg <"$tmp/psql.err" || true
            fi
            psql_pid=""
            die "psql ended before $2: ${msg:-no message} (check the psql arguments and the query)"
        fi
        sleep 0.05
    done
}

if [ -n "$qfile" ]; then
    # psql ends on the first error (ON_ERROR_STOP) or a failed connection, perhaps while
    # this script still writes to it: a write then fails (EPIPE) instead of killing the
    # script with SIGPIPE, and wait_for_line reports psql's own message
    trap '' PIPE
    mkfifo "$tmp/psql.in" || die "cannot create a fifo in $tmp"
    psql -X -q -A -t -v ON_ERROR_STOP=1 "$@" <"$tmp/psql.in" >"$tmp/psql.out" 2>"$tmp/psql.err" &
    psql_pid=$!
    exec 3>"$tmp/psql.in"
    printf '%s\n' "SELECT pg_backend_pid();" '\timing on' '\echo pk-record-ready' >&3 2>/dev/null
    wait_for_line pk-record-ready "it connected"
    IFS= read -r pid <"$tmp/psql.out" || pid=""
    case "$pid" in ''|*[!0-9]*) die "could not read the backend pid from psql (got '$pid')" ;; esac
fi

[ -d "/proc/$pid" ] || die "no process $pid: give the pid of a PostgreSQL backend (SELECT pg_backend_pid())"
comm=""
if [ -r "/proc/$pid/comm" ]; then
    IFS= read -r comm < "/proc/$pid/comm" || true
fi
case "$comm" in
    postgres|postmaster|postgres:*) ;;
    *) die "process $pid is '$comm', not a PostgreSQL backend: give the pid of a backend (SELECT pg_backend_pid())" ;;
esac
# now: with --query-file the backend ends with the psql session
pgversion=$("/proc/$pid/exe" --version 2>/dev/null) || pgversion=""

name="pk-record-$host-$pid-$stamp"
[ -n "$out" ] || out="$name.tar.gz"
mkdir -p "$tmp/$name" || die "cannot create $tmp/$name"
dir="$tmp/$name"

# a private build-id cache, so the vDSO perf saves can be found (and ~/.debug is left alone)
bid="$dir/buildid"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# --query-file: perf starts with its events off and turns them on when told, and says when
# it has (--control, perf >= 5.9): perf writes perf.data's header before it reads the
# backend's memory maps and turns its events on, so a short query sent on the header alone
# ran unrecorded. An older perf: the header, then a pause.
ctl=""
if [ -n "$qfile" ]; then
    perf_help=$(perf record -h 2>&1)
    case "$perf_help" in
        *--control*) mkfifo "$tmp/perf.ctl" "$tmp/perf.ack" && ctl=1 ;;
    esac
fi
if [ -n "$ctl" ]; then
    perf --buildid-dir "$bid" record -F "$freq" -g -p "$pid" -o "$dir/perf.data" -D -1 \
        --control "fifo:$tmp/perf.ctl,$tmp/perf.ack" >"$dir/perf-record.log" 2>&1 &
else
    perf --buildid-dir "$bid" record -F "$freq" -g -p "$pid" -o "$dir/perf.data" \
        >"$dir/perf-record.log" 2>&1 &
fi
perf_pid=$!
if [ -n "$qfile" ]; then
    i=0
    while [ ! -s "$dir/perf.data" ]; do
        kill -0 "$perf_pid" 2>/dev/null || break
        i=$((i + 1))
        [ $i -lt 200 ] || die "perf did not start recording within 10 s: $(cat "$dir/perf-record.log")"
        sleep 0.05
    done
    kill -0 "$perf_pid" 2>/dev/null || die "perf record ended before it recorded: $(cat "$dir/perf-record.log")"
    if [ -n "$ctl" ]; then
        # perf holds both fifos open (read-write) from its start: these opens do not block
        exec 4>"$tmp/perf.ctl" 5<"$tmp/perf.ack"
        printf '%s\n' enable >&4
        ack=""
        IFS= read -r ack <&5 || ack=""
        exec 4>&- 5<&-
        [ "$ack" = ack ] || die "perf record did not turn its events on: $(cat "$dir/perf-record.log")"
    else
        sleep 0.5
    fi
    cp "$qfile" "$dir/query.sql"
    started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    : >"$tmp/psql.out"
    # the file line by line (the last one may lack its newline), N times, each run after
    # a marker line; then the end marker
    i=0
    while [ "$i" -lt "$repeat" ]; do
        i=$((i + 1))
        printf '%s\n' "\\echo pk-record-run $i"
        while IFS= read -r line || [ -n "$line" ]; do
            printf '%s\n' "$line"
        done <"$qfile"
        printf '%s\n' ';'
    done >&3 2>/dev/null
    printf '%s\n' '\echo pk-record-done' >&3 2>/dev/null
    wait_for_line pk-record-done "the query finished"
else
    sleep "$seconds"
fi
if kill -INT "$perf_pid" 2>/dev/null; then
    wait "$perf_pid"
    rc=$?
else
    wait "$perf_pid"
    rc=$?
fi
perf_pid=""
ended=$(date -u +%Y-%m-%dT%H:%M:%SZ)
query_ms=""
if [ -n "$qfile" ]; then
    # the last run's output (psql's "Time: 1.234 ms" lines go to capture.txt)
    : >"$dir/query-output.txt"
    while IFS= read -r line; do
        case "$line" in
            "pk-record-run "*) : >"$dir/query-output.txt" ;;
            pk-record-done) ;;
            "Time: "*" ms"*) t=${line#Time: }; query_ms="$query_ms ${t%% *}" ;;
            *) printf '%s\n' "$line" >>"$dir/query-output.txt" ;;
        esac
    done <"$tmp/psql.out"
    query_ms=${query_ms# }
    printf '%s\n' '\q' >&3 2>/dev/null
    exec 3>&-
    wait "$psql_pid"
    psql_pid=""
    seconds=""
fi
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
{
    echo "format=pk-record 1"
    echo "pid=$pid"
    if [ -n "$qfile" ]; then echo "what=query"; else echo "what=seconds"; fi
    echo "comm=$comm"
    echo "seconds=$seconds"
    echo "repeat=$repeat"
    echo "query_ms=$query_ms"
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

#!/bin/sh
# vs-ucx.sh measures fabric/rndv over ntb beside UCX's shared-memory
# transport in one run: a stream of SIZE-byte messages into the
# receiver's own buffer, Weft eager (the copy through the ring), Weft
# rendezvous (one copy across the bridge into the receiver's region) and
# ucx_perftest tag_bw with UCX_TLS=sysv,cma,self (Debian's ucx-utils).
# The three run in turn ROUNDS times, so drift hits all alike, and the
# table gives medians in MB/s (10^6 bytes per second).
#
#	tools/vs-ucx.sh            # 64 KiB, 3 rounds
#	SIZE=1048576 ROUNDS=5 tools/vs-ucx.sh
#
# Both run their two ends as two processes: Weft's over one emulated
# bridge (shared memory; BenchmarkProcesses), UCX's over its own shared
# memory. Run it from the repository.
set -eu
SIZE=${SIZE:-65536}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-13337}
command -v ucx_perftest >/dev/null || { echo "vs-ucx: ucx_perftest not found (apt-get install ucx-utils)" >&2; exit 1; }
case $SIZE in
65536) name=64KiB ;; 1048576) name=1MiB ;; 8192) name=8KiB ;;
*) echo "vs-ucx: SIZE must be one of 8192 65536 1048576" >&2; exit 1 ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/rndv.test" ./fabric/rndv/
for r in $(seq "$ROUNDS"); do
	"$tmp/rndv.test" -test.run XXX -test.bench "^BenchmarkProcesses\$/^ntb\$/^$name\$" -test.benchtime 1s |
		awk '/^Benchmark/ { split($1, p, "/"); sub(/-[0-9]+$/, "", p[4]); for (i = 1; i <= NF; i++) if ($(i+1) == "MB/s") print p[4], $i }' >>"$tmp/res"
	UCX_TLS=sysv,cma,self ucx_perftest -t tag_bw -s "$SIZE" -n 100000 -p "$PORT" >/dev/null 2>&1 &
	srv=$!
	ok=
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		sleep 0.3
		if out=$(UCX_TLS=sysv,cma,self ucx_perftest -t tag_bw -s "$SIZE" -n 100000 -p "$PORT" localhost 2>/dev/null); then
			ok=1
			break
		fi
	done
	wait "$srv" || true
	[ -n "$ok" ] || { echo "vs-ucx: ucx_perftest did not run" >&2; exit 1; }
	# Final: iterations, latency 50%, avg, overall, BW average, BW overall (MB/s of 2^20 bytes).
	echo "$out" | awk '/^Final:/ { printf "ucx-tag_bw %.2f\n", $7 * 1048576 / 1e6 }' >>"$tmp/res"
done
echo "$SIZE-byte messages, $ROUNDS rounds, MB/s (10^6 B/s):"
for k in eager rndv ucx-tag_bw; do
	grep "^$k " "$tmp/res" | awk '{ print $2 }' | sort -n | awk -v k="$k" '{ v[NR] = $1; all = all " " $1 } END { printf "%-11s median %9.0f   runs:%s\n", k, v[int((NR + 1) / 2)], all }'
done

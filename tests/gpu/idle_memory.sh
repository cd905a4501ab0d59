# Sourced by the GPU machine's measurement scripts (bench.sh, work_queues.sh).
#
# ferryd_idle_memory FERRYD FIELDS TOP [ENV=VALUE]: start FERRYD (with ENV=VALUE in its
# environment, when given) on a socket in a new temp dir, wait until it is ready (up to 20 s),
# print the /proc/PID/status lines matching the regex FIELDS and its TOP largest mappings by
# resident memory (/proc/PID/smaps), then stop it.
ferryd_idle_memory() {
  local ferryd=$1 fields=$2 top=$3 sock pid
  sock=$(mktemp -d)/ferryd.sock
  env ${4:-} "$ferryd" --listen "unix:$sock" --ready-file "$sock.ready" --log-level warn &
  pid=$!
  for _ in $(seq 200); do [[ -s "$sock.ready" ]] && break; sleep 0.1; done
  grep -E "$fields" /proc/$pid/status
  awk '/^[0-9a-f]+-[0-9a-f]+ /{name=($6==""?"[anon]":$6)} /^Rss:/{rss[name]+=$2}
       END{for(n in rss) printf "%8.1f MiB  %s\n", rss[n]/1024, n}' /proc/$pid/smaps |
    sort -rn | head -"$top"
  kill $pid; wait $pid
}

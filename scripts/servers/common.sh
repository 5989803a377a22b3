# Shell helpers shared by the test-server scripts (sourced, not run).

stop_pidfile() {  # stop_pidfile FILE: TERM the process, wait for it, remove the file
  local file=$1 pid
  [ -s "$file" ] || return 0
  pid=$(cat "$file")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$file"
}

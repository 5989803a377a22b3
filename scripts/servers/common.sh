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

apt_install() {  # apt_install PKG...: install Debian packages, quietly and non-interactively
  printf '%s: apt-get install %s\n' "$(basename "$0")" "$*" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

one_process_server() {  # one_process_server CMD PIDFILE: install and stop exit here; start
  case $1 in            # returns, installed (the caller's install) and the old process gone
    install) install; exit 0 ;;
    stop) stop_pidfile "$2"; exit 0 ;;
    start) install; stop_pidfile "$2" ;;
    *) log "unknown command $1"; exit 2 ;;
  esac
}

# Host helpers shared by local-stack.sh, pg-ha.sh, check-deploy.sh and bench/celery/run.sh
# (sourced, not run). The caller defines log and die, and STACK (the folder whose
# logs/apt.log records what apt-get did) where it calls apt_install.

# The newest installed PostgreSQL's bin folder (Debian's /usr/lib/postgresql/N/bin), or
# nothing when there is none.
pg_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && echo "$d"; done | sort -V | tail -n 1
}

# apt_install PACKAGE...: installs Debian packages (root only), updating the index once
# per run, without letting their postinst scripts start system-wide services.
apt_updated=0
apt_install() {
  [ "$(id -u)" = 0 ] || die "need $* but not root: install them with your package manager"
  command -v apt-get >/dev/null || die "need $* and apt-get is missing"
  if [ "$apt_updated" = 0 ]; then
    log "apt-get update"
    apt-get update -qq >"$STACK/logs/apt.log" 2>&1 || die "apt-get update failed: $STACK/logs/apt.log"
    apt_updated=1
  fi
  log "apt-get install $*"
  # policy-rc.d keeps Debian's postinst scripts from starting system-wide services.
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
    >>"$STACK/logs/apt.log" 2>&1 || { rm -f /usr/sbin/policy-rc.d; die "apt-get install $* failed: $STACK/logs/apt.log"; }
  rm -f /usr/sbin/policy-rc.d
}

# make_venv DIR: a fresh Python virtual environment in DIR. When python3 cannot make one
# (Debian without python3-venv) and this runs as root with apt-get, installs python3-venv
# and tries again; otherwise dies with python3's error.
make_venv() {
  local venv=$1 err
  err=$(mktemp)
  rm -rf "$venv"
  if python3 -m venv "$venv" 2>"$err"; then
    rm -f "$err"
    return 0
  fi
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    rm -f "$err"
    log "python3 -m venv failed; installing Debian's python3-venv"
    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null; }
    rm -rf "$venv"
    python3 -m venv "$venv"
  else
    cat "$err" >&2
    rm -f "$err"
    die "python3 -m venv failed: install python3-venv (Debian) and run again"
  fi
}

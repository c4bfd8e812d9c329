# Installs Debian packages only when they are missing; sourced by scripts/test.sh and
# scripts/chart-tools.sh.
#
#   ensure_apt_packages "package:probe" ...
#
# The probe proves the package is present: a command name (`command -v`), or, when it holds
# a space, a shell command that must succeed. With no probe, `dpkg -s package` decides.
# `apt-get update` runs only when something is missing.

ensure_apt_packages() {
  local missing=() entry pkg probe
  for entry in "$@"; do
    pkg="${entry%%:*}"
    probe=""
    [[ "$entry" == *:* ]] && probe="${entry#*:}"
    if [[ "$probe" == *" "* ]]; then
      bash -c "$probe" >/dev/null 2>&1 && continue
    elif [[ -n "$probe" ]]; then
      command -v "$probe" >/dev/null 2>&1 && continue
    elif ! command -v dpkg >/dev/null 2>&1 || dpkg -s "$pkg" >/dev/null 2>&1; then
      continue
    fi
    missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0

  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: missing packages (${missing[*]}) and no apt-get to install them" >&2
    return 1
  fi
  local sudo=()
  if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "error: missing packages (${missing[*]}); run as root to install them" >&2
      return 1
    fi
  fi
  echo "==> installing ${missing[*]}"
  "${sudo[@]}" apt-get update
  # No service a package ships is started by its installation (etcd-server would start a
  # system etcd on :2379): a policy-rc.d that says "not now" (exit 101) for the length of
  # the install, removed after unless it was there before.
  local policy=/usr/sbin/policy-rc.d placed=""
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\n# ichor-rules scripts/apt.sh: no service starts during this install\nexit 101\n' |
      "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 0755 "$policy"
    placed=yes
  fi
  local rc=0
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}" || rc=$?
  [[ -n "$placed" ]] && "${sudo[@]}" rm -f "$policy"
  return "$rc"
}

# Stops and disables system services a package installed (on a machine booted with
# systemd; elsewhere nothing runs them): the tests start their own, on 127.0.0.1 and
# ports of their own.
disable_services() {
  [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1 || return 0
  local sudo=()
  [[ "$(id -u)" -ne 0 ]] && command -v sudo >/dev/null 2>&1 && sudo=(sudo)
  local unit
  for unit in "$@"; do
    if systemctl is-enabled --quiet "$unit" 2>/dev/null || systemctl is-active --quiet "$unit" 2>/dev/null; then
      echo "==> systemctl disable --now $unit (the tests run their own)"
      "${sudo[@]}" systemctl disable --now "$unit" || true
    fi
  done
}

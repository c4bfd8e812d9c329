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
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
}

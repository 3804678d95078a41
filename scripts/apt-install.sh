#!/usr/bin/env bash
# Installs the Debian packages named as arguments that are missing (as root;
# otherwise names them and fails). Safe to run again.
set -euo pipefail
missing=()
for package in "$@"; do
  # Installed, not merely known (a removed package keeps its config files).
  [[ $(dpkg-query -W -f='${Status}' "$package" 2>/dev/null) == "install ok installed" ]] || missing+=("$package")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "installing system packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing system packages: ${missing[*]} (install them, or run this as root)" >&2
    exit 1
  fi
fi

#!/usr/bin/env bash
# Install the Debian packages isokv needs, and only those that are missing.
# Idempotent: a second run installs nothing and does not touch the network.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libxxhash-dev libopenblas-dev libcjson-dev
      zlib1g-dev libcmocka-dev gnuplot-nox libmicrohttpd-dev libhiredis-dev
      redis-server redis-tools libcurl4-openssl-dev curl jq clang)
# Node.js runs only the OpenAI-client test; a Node install from elsewhere (with its own npm) counts.
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
